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
//!
//! # Scaling a role
//! A scale ([`Master::scale`]) is an elastic restart of the trainers that keeps every row delivered
//! exactly once. [`Entry::RoleScaled`] records the role's new size, and then:
//! 1. every trainer running retires (the service stops them); no trainer is launched meanwhile;
//! 2. once none runs, each live daemon gets [`v1::Release`] at its next call: it reports its tasks'
//!    final consumed counts in a heartbeat (the rings' read cursors, which no trainer moves any
//!    more), removes its rings with the rows still unread, and registers again holding nothing, so
//!    the task table queues every task it held again from its consumed count (the `Register`
//!    decision for a live node that no longer lists a task). Rows a trainer had read but not
//!    released are not consumed: they go to the new trainers, as after a trainer's crash;
//! 3. a daemon that registers while another still feeds rings of the old ranks is told no ranks; once
//!    none does, it gets [`v1::Release`] again, and its registration's answer names its new ranks,
//!    numbered over the new role sizes in role order;
//! 4. once every live daemon has its new ranks, the trainers are launched with the new
//!    `SLUICE_WORLD_SIZE`.
//!
//! Every step follows from journaled entries (the scale, the trainers' exits, the registrations and
//! lost nodes), so an AM that takes the job over mid-scale carries on where it stood; the commands
//! are not queued but derived at each call from where the scale stands. Data checkpoints still
//! waiting for ranks are dropped, since the ranks that would complete them are gone; stored ones stay
//! valid, because a checkpoint is a position in the task table, whatever the world size.
//!
//! # Restoring a data checkpoint
//! A restore ([`Master::restore`]) on a live job is an elastic restart from the checkpoint, as
//! torchelastic restarts every worker when one fails: [`Entry::Restored`] resets the task table to
//! the checkpoint's position (every task in flight queued again from its consumed count at the
//! checkpoint), and the trainers restart in place through the steps of a scale that keeps the
//! role sizes: every running trainer retires, every live daemon gets [`v1::Release`] and drops the
//! rows still in its rings, and the trainers are launched again once every daemon has its ranks.
//! Until then no task is handed out, so no trainer that is about to be stopped consumes a row
//! after the checkpoint; the counts the daemons report for the tasks they held before the reset
//! are refused, since the reset table gives those tasks to no one.
//!
//! The AM remembers the checkpoint it was last restored to (by a call or by `--resume-from`) and
//! the rows consumed then. A restore to that checkpoint while no row was consumed since changes
//! nothing: the trainers relaunched by a restore each load the same checkpoint and call again, and
//! they converge. A restore to another checkpoint then is refused, naming both: the ranks loaded
//! different steps, and restoring each in turn would restart the trainers for ever.

pub mod checkpoint;
mod convert;

#[cfg(test)]
mod tests;

use crate::decide::{
    Action, DataPosition, DecideConfig, Event, JobOutcome, JobState, NodeId, NodeStatus,
    RestoreMode, TableSnapshot, TaskId, decide,
};
use crate::error::{AmError, Result};
use crate::launcher::{ExecutorId, ExecutorState, Executors, Exit, LaunchAction};
use crate::plan::{JobPlan, PlannedFile, PlannedSplit};
use crate::spec::{FollowSpec, JobSpec};
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
    /// A role's size changed.
    RoleScaled {
        /// The role.
        role: String,
        /// Its new number of trainers.
        num: u32,
    },
    /// A stop of the job was requested.
    StopRequested {
        /// Why, for logs and status.
        reason: String,
    },
    /// A followed source grew: its new files and splits join the plan, and their tasks the
    /// current epoch.
    SplitsAdded {
        /// The index of the source in the spec.
        source: u32,
        /// For a Delta table, the version planned up to, this one included.
        version: Option<u64>,
        /// The new files.
        files: Vec<PlannedFile>,
        /// Their splits, with file indices counted from the first of `files`.
        splits: Vec<PlannedSplit>,
    },
    /// A source is no longer followed.
    FollowEnded {
        /// The index of the source in the spec.
        source: u32,
        /// Why, for logs and status.
        reason: String,
    },
    /// The AM started an executor.
    ExecutorLaunched {
        /// The executor.
        id: ExecutorId,
    },
    /// An executor ended.
    ExecutorExited {
        /// The executor.
        id: ExecutorId,
        /// How.
        exit: Exit,
    },
}

/// The AM's state at one point of its journal, from which the entries after it replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    position: TableSnapshot,
    last_seen_ms: BTreeMap<NodeId, u64>,
    pieces: BTreeMap<TaskId, u64>,
    checkpoints: BTreeMap<u64, PendingCheckpoint>,
    stored: BTreeMap<u64, String>,
    stop_reason: Option<String>,
    executors: Option<Executors>,
    last_task_failure: Option<String>,
    role_sizes: Vec<u32>,
    rescale: Option<Rescale>,
    follows: Vec<Option<SourceFollow>>,
    added_files: Vec<PlannedFile>,
    added_splits: Vec<PlannedSplit>,
    restored: Option<RestoredAt>,
}

/// The data checkpoint the task table was last reset to, and the rows consumed right after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct RestoredAt {
    token: String,
    /// [`Master::rows_consumed_total`] right after the reset.
    rows_consumed: u64,
}

/// A scale under way: who still has to give rings back and who waits for ranks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Rescale {
    /// The role sizes before the scale, over which the releasing nodes' rings are ranked.
    previous_sizes: Vec<u32>,
    /// Live nodes that still feed rings of the previous ranks.
    releasing: BTreeSet<NodeId>,
    /// Nodes that hold no ring and wait for their new ranks.
    waiting: BTreeSet<NodeId>,
    /// Whether a restore to a data checkpoint started it: no task is handed out until it ends.
    restore: bool,
}

/// Where following a source stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFollow {
    /// Whether the source is still followed.
    pub following: bool,
    /// For a Delta table, the last version planned.
    pub version: Option<u64>,
    /// Why following ended, once it has.
    pub ended: Option<String>,
}

/// What the follower needs to poll a source that is still followed.
#[derive(Debug, Clone)]
pub struct FollowTarget {
    /// The index of the source in the spec.
    pub source: u32,
    /// How it is followed.
    pub spec: FollowSpec,
    /// For a Delta table, the last version planned.
    pub version: Option<u64>,
    /// The URIs of the source's planned files.
    pub planned: std::collections::HashSet<String>,
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Records where the tasks of the splits from `first_split` on begin in the table: each such
    /// split's tasks were appended together, the first at the lowest slot that reads the split.
    fn place_added(&mut self, table: &JobState, first_split: usize) {
        self.first_slot.truncate(first_split);
        let splits = table.split_count();
        let mut first = vec![u32::MAX; splits.saturating_sub(first_split)];
        for (slot, split) in table.task_splits().enumerate().skip(self.planned as usize) {
            let split = split as usize;
            if split >= first_split {
                let entry = &mut first[split - first_split];
                *entry = (*entry).min(slot as u32);
            }
        }
        self.first_slot.extend(first);
    }

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
        let Some(span) = table.task_span(slot) else {
            debug_assert!(false, "slot {slot} is a task of the current epoch");
            return 0;
        };
        let split = span.split as usize;
        if slot < self.planned {
            return u64::from(slot - self.first_slot[split]) * self.task_rows;
        }
        let task = TaskId(table.first_task_id() + u64::from(slot));
        if let Some(origin) = self.pieces.get(&task) {
            return *origin;
        }
        // A task of a split a followed source added: that split's tasks sit together.
        let first = self.first_slot.get(split).copied();
        debug_assert!(
            first.is_some_and(|first| first <= slot),
            "every slot past the planned ones is a re-split piece or an added split's task"
        );
        first.map_or(span.start, |first| u64::from(slot - first) * self.task_rows)
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
    /// The last task that failed for good, and why: the cause a failed job's reason names.
    last_task_failure: Option<String>,
    shut_down: BTreeSet<NodeId>,
    throughput: Throughput,
    executors: Option<Executors>,
    /// Where following each source stands; `None` for a source not followed.
    follows: Vec<Option<SourceFollow>>,
    /// The files and splits followed sources added after the stored plan, as journaled.
    added_files: Vec<PlannedFile>,
    added_splits: Vec<PlannedSplit>,
    /// Each role's number of trainers, in spec order: the spec's, or a scale's.
    role_sizes: Vec<u32>,
    rescale: Option<Rescale>,
    restored: Option<RestoredAt>,
    /// The latest time of a change applied, journaled or replayed: the time a new AM's clock
    /// continues from, so that the journal's times never go back.
    latest_ms: u64,
}

/// The trainer ranks node `node` of `nodes` feeds when the roles have `sizes` trainers: the ranks
/// in contiguous blocks over the nodes.
fn ranks_over(sizes: &[u32], nodes: u32, node: NodeId) -> Vec<u32> {
    let nodes = u64::from(nodes.max(1));
    let world: u64 = sizes.iter().map(|size| u64::from(*size)).sum();
    (0..world)
        .filter(|rank| rank * nodes / world.max(1) == node.0)
        .map(|rank| rank as u32)
        .collect()
}

impl Master {
    /// Plans the first epoch of a job over its planned splits.
    pub fn new(spec: Arc<JobSpec>, plan: Arc<JobPlan>) -> Result<Master> {
        let config = DecideConfig::from_spec(&spec);
        let split_rows = plan.split_rows();
        let origins = TaskOrigins::new(&split_rows, config.task_rows);
        let table = JobState::new(config, split_rows)?;
        let role_sizes = spec.roles.iter().map(|role| role.num).collect();
        let follows = spec
            .data
            .sources
            .iter()
            .enumerate()
            .map(|(index, source)| {
                source.follow.as_ref().map(|_| SourceFollow {
                    following: true,
                    version: plan.versions.get(index).copied().flatten(),
                    ended: None,
                })
            })
            .collect();
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
            last_task_failure: None,
            shut_down: BTreeSet::new(),
            throughput: Throughput::default(),
            executors: None,
            role_sizes,
            rescale: None,
            follows,
            added_files: Vec::new(),
            added_splits: Vec::new(),
            restored: None,
            latest_ms: 0,
        })
    }

    /// Makes this AM the launcher of the job's executors: a daemon per node and the trainers of
    /// every role, ranked in role order.
    pub fn launch_executors(&mut self) {
        let daemons = (0..self.spec.nodes).map(ExecutorId::Daemon);
        let trainers = self
            .trainer_ranks()
            .into_iter()
            .map(|(role, rank)| ExecutorId::Trainer {
                role: role.to_owned(),
                rank,
            });
        self.executors = Some(Executors::new(
            daemons.chain(trainers).collect::<Vec<_>>(),
            &self.spec.failover,
        ));
    }

    /// Every trainer of the job as (role, rank), ranks numbered across roles in spec order.
    pub fn trainer_ranks(&self) -> Vec<(&str, u32)> {
        let mut rank = 0;
        let mut ranks = Vec::new();
        for (role, size) in self.spec.roles.iter().zip(&self.role_sizes) {
            for _ in 0..*size {
                ranks.push((role.name.as_str(), rank));
                rank += 1;
            }
        }
        ranks
    }

    /// The executors this AM launches, if it launches them.
    pub fn executors(&self) -> Option<&Executors> {
        self.executors.as_ref()
    }

    /// The job spec.
    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }

    /// Records that an executor was started.
    pub fn executor_launched(&mut self, id: ExecutorId) -> Applied<()> {
        if let Some(executors) = &mut self.executors {
            executors.launched(&id);
        }
        Applied {
            reply: (),
            entries: vec![Entry::ExecutorLaunched { id }],
        }
    }

    /// Records how an executor ended; the failover rules decide whether it runs again.
    pub fn executor_exited(&mut self, id: ExecutorId, exit: Exit) -> Applied<()> {
        if let Some(executors) = &mut self.executors {
            executors.exited(&id, exit);
        }
        self.settle_rescale();
        Applied {
            reply: (),
            entries: vec![Entry::ExecutorExited { id, exit }],
        }
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
        self.role_sizes.iter().sum()
    }

    /// The trainer ranks node `node` feeds: the job's ranks in contiguous blocks over its nodes.
    pub fn ranks_of(&self, node: NodeId) -> Vec<u32> {
        ranks_over(&self.role_sizes, self.spec.nodes, node)
    }

    /// The ranks a registering node opens rings for, and the world size they belong to: during a
    /// scale, none for a node waiting for its new ranks, and the previous ones for a node that
    /// still feeds rings of them.
    fn ranks_told(&self, node: NodeId) -> (Vec<u32>, u32) {
        match &self.rescale {
            Some(rescale) if rescale.waiting.contains(&node) => (Vec::new(), self.world_size()),
            Some(rescale) if rescale.releasing.contains(&node) => (
                ranks_over(&rescale.previous_sizes, self.spec.nodes, node),
                rescale.previous_sizes.iter().sum(),
            ),
            _ => (self.ranks_of(node), self.world_size()),
        }
    }

    /// The executors to launch now: none of the trainers while a scale is under way.
    pub fn executors_to_launch(&self) -> Vec<LaunchAction> {
        let Some(executors) = &self.executors else {
            return Vec::new();
        };
        executors
            .to_launch()
            .into_iter()
            .filter(|LaunchAction::Launch(id)| {
                self.rescale.is_none() || matches!(id, ExecutorId::Daemon(_))
            })
            .collect()
    }

    /// Whether a scale is under way.
    pub fn scaling(&self) -> bool {
        self.rescale.is_some()
    }

    /// Sets the number of trainers of `role` to `num`: the trainers are stopped and launched again
    /// over the new ranks (see the module's documentation).
    pub fn scale(&mut self, role: &str, num: u32) -> Result<Applied<v1::ScaleRoleReply>> {
        if self.executors.is_none() {
            return Err(AmError::FailedPrecondition(format!(
                "role {role:?}: this AM launches no executors, so it cannot scale them; run the job with `sluice run` or `sluice submit` to let the AM launch them"
            )));
        }
        let Some(index) = self.spec.roles.iter().position(|found| found.name == role) else {
            let names: Vec<&str> = self
                .spec
                .roles
                .iter()
                .map(|found| found.name.as_str())
                .collect();
            return Err(AmError::InvalidRequest(format!(
                "role {role:?} is not a role of job {}; name one of {names:?}",
                self.spec.name
            )));
        };
        if num == 0 {
            return Err(AmError::InvalidRequest(format!(
                "role {role:?}: cannot scale to 0 trainers; a role keeps at least one, as in the job spec (stop the job with `sluice stop` to end it)"
            )));
        }
        if let Some(why) = self.finishing() {
            return Err(AmError::FailedPrecondition(format!(
                "role {role:?}: the job is finishing ({why}), so it is not scaled"
            )));
        }
        if self.rescale.is_some() {
            return Err(AmError::FailedPrecondition(format!(
                "role {role:?}: an earlier scale is under way (trainers stopping or daemons giving their rings back); wait until `sluice status` shows the roles' trainers running, then scale again"
            )));
        }
        let previous_num = self.role_sizes[index];
        let reply = v1::ScaleRoleReply { previous_num, num };
        if previous_num == num {
            return Ok(Applied {
                reply,
                entries: Vec::new(),
            });
        }
        self.apply_scale(index, num);
        Ok(Applied {
            reply,
            entries: vec![Entry::RoleScaled {
                role: role.to_owned(),
                num,
            }],
        })
    }

    /// Why the job is finishing, if it is: a scale then would relaunch trainers with nothing left
    /// to give them.
    fn finishing(&self) -> Option<String> {
        if let Some(state) = self.outcome() {
            return Some(format!("it {}", crate::status::state_name(state)));
        }
        if let Some(reason) = &self.stop_reason {
            return Some(format!("a stop was asked for: {reason}"));
        }
        if self.table.outcome().is_some() {
            return Some("every row is delivered".to_owned());
        }
        let succeeded = self
            .executors
            .as_ref()
            .and_then(Executors::a_trainer_succeeded)?;
        Some(format!("{succeeded} exited with success"))
    }

    fn apply_scale(&mut self, role: usize, num: u32) {
        let previous_sizes = self.role_sizes.clone();
        self.role_sizes[role] = num;
        let trainers: Vec<ExecutorId> = self
            .trainer_ranks()
            .into_iter()
            .map(|(name, rank)| ExecutorId::Trainer {
                role: name.to_owned(),
                rank,
            })
            .collect();
        if let Some(executors) = &mut self.executors {
            executors.replace_trainers(trainers);
        }
        tracing::info!(
            role = self.spec.roles[role].name,
            from = previous_sizes[role],
            to = num,
            "role scaled: stopping the trainers"
        );
        self.take_rings_back(previous_sizes, false);
    }

    /// Starts taking every live node's rings back once the retiring trainers are gone. The rings
    /// the nodes hold are ranked over `previous_sizes`.
    fn take_rings_back(&mut self, previous_sizes: Vec<u32>, restore: bool) {
        let releasing = self.table.alive_nodes().collect();
        self.rescale = Some(Rescale {
            previous_sizes,
            releasing,
            waiting: BTreeSet::new(),
            restore,
        });
        self.checkpoints.clear();
        self.settle_rescale();
    }

    /// Whether a trainer the scale replaced still runs.
    fn trainers_retiring(&self) -> bool {
        self.executors
            .as_ref()
            .is_some_and(|executors| executors.retiring().next().is_some())
    }

    /// Whether `node` is due a [`v1::Release`]: it feeds rings of the previous ranks and no trainer
    /// reads them any more, or it waits for its new ranks and no node feeds rings of the previous
    /// ones.
    fn release_due(&self, node: NodeId) -> bool {
        let Some(rescale) = &self.rescale else {
            return false;
        };
        !self.trainers_retiring()
            && (rescale.releasing.contains(&node)
                || (rescale.releasing.is_empty() && rescale.waiting.contains(&node)))
    }

    /// Follows a scale through a registration: a node that gave its rings back waits for its new
    /// ranks while others still feed rings of the previous ones, and gets them otherwise.
    fn note_registration(&mut self, node: NodeId, held_nothing: bool) {
        let retiring = self.trainers_retiring();
        let alive = self.table.node_status(node) == Some(NodeStatus::Alive);
        let Some(rescale) = &mut self.rescale else {
            return;
        };
        if !alive {
            return;
        }
        if rescale.releasing.contains(&node) {
            if !held_nothing {
                return;
            }
            rescale.releasing.remove(&node);
        }
        if retiring || !rescale.releasing.is_empty() {
            rescale.waiting.insert(node);
        } else {
            rescale.waiting.remove(&node);
        }
        self.settle_rescale();
    }

    /// A lost or blacklisted node takes no part in a scale any more.
    fn forget_in_rescale(&mut self, node: NodeId) {
        if let Some(rescale) = &mut self.rescale {
            rescale.releasing.remove(&node);
            rescale.waiting.remove(&node);
        }
        self.settle_rescale();
    }

    /// Ends the scale once no trainer of the previous ranks runs and every live node has its new
    /// ranks: the trainers may then be launched.
    fn settle_rescale(&mut self) {
        let retiring = self.trainers_retiring();
        let Some(rescale) = &self.rescale else {
            return;
        };
        if !retiring && rescale.releasing.is_empty() && rescale.waiting.is_empty() {
            let restore = rescale.restore;
            self.rescale = None;
            if restore {
                tracing::info!(
                    world_size = self.world_size(),
                    "rings taken back after a restore: the trainers launch again"
                );
            } else {
                tracing::info!(
                    world_size = self.world_size(),
                    "scale done: the trainers launch over the new ranks"
                );
            }
        }
    }

    /// The latest time of the changes applied so far, journaled or replayed, on the AM's clock
    /// (see [`crate::clock`]): an AM that takes the job over continues its clock from there.
    pub fn latest_ms(&self) -> u64 {
        self.latest_ms
    }

    /// Applies a journal entry during recovery; commands it would send are dropped, since the
    /// daemons they were meant for ask again.
    pub fn replay(&mut self, entry: Entry) -> Result<()> {
        match entry {
            Entry::Event(event) => {
                // The event's commands (assignments, stops, fences) stay out of the outbox: a
                // daemon holds what it was assigned, and [`Master::resume_commands`] asks again
                // for the stops still due.
                let outbox = std::mem::take(&mut self.outbox);
                self.apply_event(None, event);
                self.outbox = outbox;
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
                token,
                position,
                now_ms,
            } => self.apply_restore(token, position, now_ms)?,
            Entry::RoleScaled { role, num } => {
                let index = self
                    .spec
                    .roles
                    .iter()
                    .position(|found| found.name == role)
                    .ok_or_else(|| {
                        AmError::FailedPrecondition(format!(
                            "the journal scales role {role:?}, which the job spec does not have; start the AM with the spec the job was run with"
                        ))
                    })?;
                self.apply_scale(index, num);
            }
            Entry::StopRequested { reason } => self.stop_reason = Some(reason),
            Entry::SplitsAdded {
                source,
                version,
                files,
                splits,
            } => self.apply_added(source, version, files, splits),
            Entry::FollowEnded { source, reason } => self.apply_follow_ended(source, reason),
            Entry::ExecutorLaunched { id } => {
                self.executor_launched(id);
            }
            Entry::ExecutorExited { id, exit } => {
                self.executor_exited(id, exit);
            }
        }
        Ok(())
    }

    /// The state to write as a snapshot: replaying the entries journaled after it over
    /// [`Master::restore_snapshot`] gives the state this master will then have.
    ///
    /// Cheap enough to take under the master's lock: the task table is captured, not copied (see
    /// [`JobState::capture`]), and encoding the snapshot is left to the journal's own threads.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            position: self.table.capture(),
            last_seen_ms: self
                .table
                .nodes()
                .map(|(node, view)| (node, view.last_seen_ms))
                .collect(),
            pieces: self.origins.pieces.clone(),
            checkpoints: self.checkpoints.clone(),
            stored: self.stored.clone(),
            stop_reason: self.stop_reason.clone(),
            executors: self.executors.clone(),
            last_task_failure: self.last_task_failure.clone(),
            role_sizes: self.role_sizes.clone(),
            rescale: self.rescale.clone(),
            follows: self.follows.clone(),
            added_files: self.added_files.clone(),
            added_splits: self.added_splits.clone(),
            restored: self.restored.clone(),
        }
    }

    /// Replaces this master's state with a snapshot of the same job.
    pub fn restore_snapshot(&mut self, snapshot: Snapshot) -> Result<()> {
        let planned_splits = self.plan.splits.len() - self.added_splits.len();
        let plan = Arc::make_mut(&mut self.plan);
        plan.files
            .truncate(plan.files.len() - self.added_files.len());
        plan.splits.truncate(planned_splits);
        let first_file = plan.files.len() as u32;
        plan.files.extend_from_slice(&snapshot.added_files);
        plan.splits
            .extend(snapshot.added_splits.iter().map(|split| PlannedSplit {
                file: first_file + split.file,
                ..*split
            }));
        self.added_files = snapshot.added_files;
        self.added_splits = snapshot.added_splits;
        self.follows = snapshot.follows;
        let mut table = JobState::restore(
            self.config,
            self.plan.split_rows(),
            snapshot.position.into_position(),
            RestoreMode::Resume { now_ms: 0 },
        )?;
        table.restore_last_seen(&snapshot.last_seen_ms);
        let latest_seen_ms = snapshot.last_seen_ms.values().copied().max();
        self.latest_ms = self.latest_ms.max(latest_seen_ms.unwrap_or(0));
        self.table = table;
        self.origins.pieces = snapshot.pieces;
        self.origins.place_added(&self.table, planned_splits);
        self.checkpoints = snapshot.checkpoints;
        self.stored = snapshot.stored;
        self.stop_reason = snapshot.stop_reason;
        self.last_task_failure = snapshot.last_task_failure;
        if snapshot.executors.is_some() {
            self.executors = snapshot.executors;
        }
        if snapshot.role_sizes.len() == self.role_sizes.len() {
            self.role_sizes = snapshot.role_sizes;
        }
        self.rescale = snapshot.rescale;
        self.restored = snapshot.restored;
        Ok(())
    }

    /// Queues again the commands the table implies after a recovery: a stop request for every
    /// task whose stop is not yet acknowledged.
    ///
    /// Reads only the tasks in flight: copying the whole table into a position here would make a
    /// new AM of a ten-million-task job hold it twice while it takes the job over.
    pub fn resume_commands(&mut self) {
        let mut stops: Vec<(TaskId, NodeId, u64)> = self
            .table
            .tasks_in_flight()
            .filter_map(|flight| Some((flight.task, flight.node, flight.stop_at?)))
            .collect();
        stops.sort_unstable();
        for (task, node, row) in stops {
            self.outbox
                .entry(node)
                .or_default()
                .push(convert::stop_command(task, row));
        }
    }

    /// Gives every live node a full heartbeat timeout from `now_ms` to report in, as after an AM
    /// restart.
    pub fn grant_grace(&mut self, now_ms: u64) {
        self.table.grant_grace(now_ms);
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
        let (ranks, world_size) = self.ranks_told(node);
        Ok(Applied {
            reply: v1::RegisterReply {
                job_id: self.spec.name.clone(),
                heartbeat_interval_ms: self.spec.failover.heartbeat_interval_ms,
                commands,
                data: Some(convert::job_data(&self.spec, &self.plan)),
                ranks,
                world_size,
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
        if self.rescale.as_ref().is_some_and(|rescale| rescale.restore)
            && !self.ending_beside_the_table()
        {
            // The rings are about to be taken back: a task handed out now could be read by a
            // trainer that is being stopped, and its rows would count as consumed.
            let mut commands = self.outbox.remove(&node).unwrap_or_default();
            if self.release_due(node) {
                commands.insert(0, convert::release_command());
            }
            return Applied {
                reply: v1::AcquireTasksReply { commands },
                entries: Vec::new(),
            };
        }
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

    /// Asks the job to stop. A job that still follows a source stops following it and ends once
    /// the rows already planned are consumed; any other job shuts every daemon down at its next
    /// call.
    pub fn stop(&mut self, reason: String) -> Applied<v1::JobState> {
        if self.table.outcome().is_some() || self.stop_reason.is_some() {
            return Applied {
                reply: self.job_state(),
                entries: Vec::new(),
            };
        }
        if self.table.following() {
            let sources: Vec<u32> = self.following_sources().collect();
            let mut entries = Vec::new();
            for source in sources {
                entries.extend(self.end_follow(source, reason.clone()).entries);
            }
            return Applied {
                reply: self.job_state(),
                entries,
            };
        }
        self.stop_reason = Some(reason.clone());
        Applied {
            reply: self.job_state(),
            entries: vec![Entry::StopRequested { reason }],
        }
    }

    /// The sources still followed, by index.
    fn following_sources(&self) -> impl Iterator<Item = u32> + '_ {
        self.follows
            .iter()
            .enumerate()
            .filter(|(_, follow)| follow.as_ref().is_some_and(|follow| follow.following))
            .map(|(index, _)| index as u32)
    }

    /// What polling source `source` needs, while the job runs and the source is followed.
    pub fn follow_target(&self, source: u32) -> Option<FollowTarget> {
        let follow = self.follows.get(source as usize)?.as_ref()?;
        if !follow.following || self.table.outcome().is_some() || self.stop_reason.is_some() {
            return None;
        }
        let spec = self
            .spec
            .data
            .sources
            .get(source as usize)?
            .follow
            .clone()?;
        Some(FollowTarget {
            source,
            spec,
            version: follow.version,
            planned: self
                .plan
                .files
                .iter()
                .filter(|file| file.source == source)
                .map(|file| file.uri.clone())
                .collect(),
        })
    }

    /// Where following each source stands, `None` for a source not followed.
    pub fn follows(&self) -> &[Option<SourceFollow>] {
        &self.follows
    }

    /// A followed source grew by `block`'s files and splits (for a Delta table, up to `version`).
    pub fn add_splits(&mut self, source: u32, version: Option<u64>, block: JobPlan) -> Applied<()> {
        let entry = Entry::SplitsAdded {
            source,
            version,
            files: block.files.clone(),
            splits: block.splits.clone(),
        };
        self.apply_added(source, version, block.files, block.splits);
        Applied {
            reply: (),
            entries: vec![entry],
        }
    }

    /// Source `source` is no longer followed, for `reason`.
    pub fn end_follow(&mut self, source: u32, reason: String) -> Applied<()> {
        self.apply_follow_ended(source, reason.clone());
        Applied {
            reply: (),
            entries: vec![Entry::FollowEnded { source, reason }],
        }
    }

    /// A followed source cannot be followed further: the job fails with `reason`.
    pub fn fail_follow(&mut self, reason: String) -> Applied<()> {
        let event = Event::FollowFailed { reason };
        let entries = vec![Entry::Event(event.clone())];
        self.apply_event(None, event);
        Applied { reply: (), entries }
    }

    fn apply_added(
        &mut self,
        source: u32,
        version: Option<u64>,
        files: Vec<PlannedFile>,
        splits: Vec<PlannedSplit>,
    ) {
        if let Some(Some(follow)) = self.follows.get_mut(source as usize)
            && version.is_some()
        {
            follow.version = version;
        }
        let first_split = self.plan.splits.len();
        let split_rows: Vec<u64> = splits.iter().map(|split| split.row_count).collect();
        let first_file = self.added_files.len() as u32;
        self.added_files.extend_from_slice(&files);
        self.added_splits
            .extend(splits.iter().map(|split| PlannedSplit {
                file: first_file + split.file,
                ..*split
            }));
        Arc::make_mut(&mut self.plan).append(&files, &splits);
        if split_rows.is_empty() {
            return;
        }
        self.apply_event(None, Event::SplitsAdded { split_rows });
        self.origins.place_added(&self.table, first_split);
    }

    fn apply_follow_ended(&mut self, source: u32, reason: String) {
        if let Some(Some(follow)) = self.follows.get_mut(source as usize) {
            if !follow.following {
                return;
            }
            follow.following = false;
            follow.ended = Some(reason.clone());
        }
        tracing::info!(source, %reason, "source no longer followed");
        if self.table.following() && self.following_sources().next().is_none() {
            self.apply_event(None, Event::FollowEnded);
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

    /// Resets the task table to a stored data checkpoint and restarts the trainers from there
    /// (see "Restoring a data checkpoint" in the module's documentation). A restore to the
    /// checkpoint the job already stands at, with no row consumed since, changes nothing; one to
    /// another checkpoint then is refused.
    pub fn restore(
        &mut self,
        token: String,
        position: DataPosition,
        now_ms: u64,
    ) -> Result<Applied<v1::RestoreDataCheckpointReply>> {
        let step = self
            .stored
            .iter()
            .find(|(_, stored)| **stored == token)
            .map_or(0, |(step, _)| *step);
        let mut reply = v1::RestoreDataCheckpointReply {
            step,
            epoch: position.epoch,
            effect: self.restore_effect() as i32,
        };
        if let Some(at) = &self.restored
            && at.rows_consumed == self.rows_consumed_total()
        {
            if at.token != token {
                return Err(AmError::FailedPrecondition(format!(
                    "data checkpoint {token}: the job was restored to data checkpoint {} and no row was consumed since, so the ranks loaded different checkpoints ({} and {token}); load the states that every rank saved at the same step",
                    at.token, at.token
                )));
            }
            if self.rescale.is_none() {
                reply.effect = v1::RestoreEffect::AlreadyThere as i32;
            }
            return Ok(Applied {
                reply,
                entries: Vec::new(),
            });
        }
        self.apply_restore(token.clone(), position.clone(), now_ms)?;
        tracing::info!(%token, step, "job reset to a data checkpoint: the trainers restart");
        Ok(Applied {
            reply,
            entries: vec![Entry::Restored {
                token,
                position,
                now_ms,
            }],
        })
    }

    /// What a restore that changes the job does beside the task table.
    fn restore_effect(&self) -> v1::RestoreEffect {
        if self.executors.is_some() {
            v1::RestoreEffect::TrainersRestart
        } else {
            v1::RestoreEffect::RingsReplaced
        }
    }

    /// Resets the task table to `position`, restarts the trainers and takes the rings back.
    fn apply_restore(&mut self, token: String, position: DataPosition, now_ms: u64) -> Result<()> {
        self.latest_ms = self.latest_ms.max(now_ms);
        self.reset_to(position, now_ms)?;
        if let Some(executors) = &mut self.executors {
            executors.restart_trainers();
        }
        let previous_sizes = self.rescale.as_ref().map_or_else(
            || self.role_sizes.clone(),
            |rescale| rescale.previous_sizes.clone(),
        );
        self.take_rings_back(previous_sizes, true);
        self.restored = Some(RestoredAt {
            token,
            rows_consumed: self.rows_consumed_total(),
        });
        Ok(())
    }

    /// Resets the task table to `position`. The executors that ended for good are launched again,
    /// since the job runs again from there: a finished job's daemons and trainers run the rows
    /// after the checkpoint.
    fn reset_to(&mut self, mut position: DataPosition, now_ms: u64) -> Result<()> {
        let mut pieces = self.pieces_of(&position);
        // Ids past the position's tasks name the tasks of splits added after it, not pieces.
        let covered = position.first_task_id + position.tasks.len() as u64;
        pieces.retain(|task, _| task.0 < covered);
        // Following is where the sources stand, not where the trainers do: it is kept.
        position.following = self.table.following();
        self.table = JobState::restore(
            self.config,
            self.plan.split_rows(),
            position,
            RestoreMode::Requeue { now_ms },
        )?;
        self.origins.pieces = pieces;
        let planned_splits = self.plan.splits.len() - self.added_splits.len();
        self.origins.place_added(&self.table, planned_splits);
        self.checkpoints.clear();
        self.stop_reason = None;
        self.last_task_failure = None;
        if let Some(executors) = &mut self.executors {
            executors.restart_ended();
        }
        Ok(())
    }

    /// The origins of the re-split pieces of a position over the same epoch's tasks, kept from the
    /// current table when it is in that epoch.
    fn pieces_of(&self, position: &DataPosition) -> BTreeMap<TaskId, u64> {
        if position.epoch == self.table.epoch()
            && position.first_task_id == self.table.first_task_id()
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
        if self.ending_beside_the_table() {
            self.shut_down.insert(caller);
            let mut commands = self.outbox.remove(&caller).unwrap_or_default();
            commands.push(convert::shutdown_command());
            return (commands, Vec::new());
        }
        let entries = vec![Entry::Event(event.clone())];
        let mut commands = self.apply_event(Some(caller), event);
        if self.release_due(caller) {
            // First: the commands after it are for the rings the daemon gives back.
            commands.insert(0, convert::release_command());
        }
        (commands, entries)
    }

    /// Applies an event; returns the commands for `caller`, queueing those for other nodes.
    fn apply_event(&mut self, caller: Option<NodeId>, event: Event) -> Vec<v1::Command> {
        if let Some(now_ms) = event.now_ms() {
            self.latest_ms = self.latest_ms.max(now_ms);
        }
        let registration = match &event {
            Event::Register { node, held, .. } => Some((*node, held.is_empty())),
            _ => None,
        };
        let actions = decide(&mut self.table, event);
        if let Some((node, held_nothing)) = registration {
            self.note_registration(node, held_nothing);
        }
        let mut mine = caller
            .and_then(|node| self.outbox.remove(&node))
            .unwrap_or_default();
        for action in actions {
            let (node, command) = match action {
                Action::Assign { node, tasks } | Action::Resume { node, tasks } => {
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
            Action::TasksAdded { splits, tasks } => {
                tracing::info!(splits, tasks, "splits of a followed source added")
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
                tracing::warn!(%node, requeued, "node lost: no heartbeat within the timeout");
                self.forget_in_rescale(node);
            }
            Action::NodeBlacklisted { node, requeued } => {
                tracing::warn!(%node, requeued, "node blacklisted after repeated task failures");
                self.forget_in_rescale(node);
            }
            Action::TaskFailed {
                task,
                attempts,
                reason,
            } => {
                tracing::warn!(%task, attempts, %reason, "task failed for good");
                self.last_task_failure = Some(format!(
                    "{task} failed {attempts} times, the last: {reason}"
                ));
            }
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
    pub fn rows_consumed_total(&self) -> u64 {
        u64::from(self.table.epoch()) * self.table.epoch_rows() + self.table.done_rows()
    }

    /// Whether the job ends for a reason the task table does not know: a stop request, the
    /// executors' failures, or every trainer having exited with success.
    fn ending_beside_the_table(&self) -> bool {
        self.table.outcome().is_none()
            && (self.stop_reason.is_some()
                || self.executors.as_ref().is_some_and(|executors| {
                    executors.failure().is_some() || executors.trainers_succeeded()
                }))
    }

    /// The job's final state once it has one. With executors, the job succeeds when every trainer
    /// has exited with success; without, when the task table does.
    pub fn outcome(&self) -> Option<v1::JobState> {
        if let Some(JobOutcome::Failed { .. }) = self.table.outcome() {
            return Some(v1::JobState::Failed);
        }
        match &self.executors {
            Some(executors) if executors.failure().is_some() => {
                return Some(v1::JobState::Failed);
            }
            Some(executors) if executors.trainers_succeeded() => {
                return Some(v1::JobState::Succeeded);
            }
            Some(_) if self.stop_reason.is_some() => return Some(v1::JobState::Stopped),
            Some(_) => return None,
            None => {}
        }
        match (self.table.outcome(), &self.stop_reason) {
            (Some(_), _) => Some(v1::JobState::Succeeded),
            (None, Some(_)) => Some(v1::JobState::Stopped),
            (None, None) => None,
        }
    }

    /// Why the job failed, when it did.
    pub fn failure_reason(&self) -> Option<String> {
        if let Some(JobOutcome::Failed { reason }) = self.table.outcome() {
            return Some(match &self.last_task_failure {
                Some(cause) => format!("{reason}; {cause}"),
                None => reason.clone(),
            });
        }
        self.executors
            .as_ref()
            .and_then(|executors| executors.failure().map(str::to_owned))
    }

    /// The job's state on the wire.
    pub fn job_state(&self) -> v1::JobState {
        match self.outcome() {
            Some(state) if self.all_shut_down() => state,
            Some(v1::JobState::Stopped) => v1::JobState::Stopping,
            Some(state) => state,
            None if self.stop_reason.is_some() => v1::JobState::Stopping,
            None if self.nodes.is_empty() => v1::JobState::Starting,
            None => v1::JobState::Running,
        }
    }

    /// Whether the job is over and every live daemon was told to shut down, so the AM may exit.
    pub fn finished(&self) -> bool {
        self.outcome().is_some() && self.all_shut_down()
    }

    fn all_shut_down(&self) -> bool {
        self.table
            .alive_nodes()
            .all(|node| self.shut_down.contains(&node))
    }

    /// The job's status, for `sluice status` and the status page.
    pub fn status(&self, now_ms: u64) -> v1::StatusReply {
        let counts = self.table.task_counts();
        let nodes = self
            .table
            .nodes()
            .map(|(node, view)| {
                let info = self.nodes.get(&node).cloned().unwrap_or_default();
                v1::NodeStatus {
                    node_id: node.0,
                    hostname: info.hostname,
                    state: convert::node_state(view.status) as i32,
                    since_last_heartbeat_ms: now_ms.saturating_sub(info.last_heard_ms),
                    tasks_held: view.tasks_held,
                    task_failures: view.failures,
                    stages: info.stages,
                    rings: info.rings,
                }
            })
            .collect();
        let failure_reason = self.failure_reason();
        v1::StatusReply {
            job_id: self.spec.name.clone(),
            state: self.job_state() as i32,
            failure_reason,
            epoch: self.table.epoch(),
            epochs: self.spec.data.epochs,
            roles: self.role_statuses(),
            nodes,
            trainers: self.trainer_statuses(),
            tasks: Some(v1::TaskCounts {
                pending: counts.pending,
                in_flight: counts.in_flight,
                done: counts.done,
                failed: counts.failed,
                rows_total: self.table.epoch_rows(),
                rows_consumed: self.table.done_rows(),
                rows_failed: self.table.failed_rows(),
            }),
            rows_per_second: self.throughput.rows_per_second(),
            scaling: self.rescale.is_some(),
            sources: self.source_statuses(),
        }
    }

    fn source_statuses(&self) -> Vec<v1::SourceStatus> {
        self.spec
            .data
            .sources
            .iter()
            .enumerate()
            .map(|(index, source)| {
                let follow = self.follows.get(index).and_then(Option::as_ref);
                v1::SourceStatus {
                    uri: source.uri.clone(),
                    followed: follow.is_some(),
                    following: follow.is_some_and(|follow| follow.following),
                    planned_version: follow.and_then(|follow| follow.version).or(self
                        .plan
                        .versions
                        .get(index)
                        .copied()
                        .flatten()),
                    planned_files: self
                        .plan
                        .files
                        .iter()
                        .filter(|file| file.source as usize == index)
                        .count() as u64,
                    follow_ended: follow.and_then(|follow| follow.ended.clone()),
                }
            })
            .collect()
    }

    fn role_statuses(&self) -> Vec<v1::RoleStatus> {
        self.spec
            .roles
            .iter()
            .zip(&self.role_sizes)
            .map(|(role, size)| {
                let mut status = v1::RoleStatus {
                    name: role.name.clone(),
                    num: *size,
                    ..v1::RoleStatus::default()
                };
                let records = self.executors.iter().flat_map(Executors::records);
                for (id, record) in records {
                    if matches!(id, ExecutorId::Trainer { role: name, .. } if *name == role.name) {
                        status.running += u32::from(record.state == ExecutorState::Running);
                        status.succeeded += u32::from(record.state == ExecutorState::Succeeded);
                        status.failures += record.failures;
                    }
                }
                status
            })
            .collect()
    }

    fn trainer_statuses(&self) -> Vec<v1::TrainerStatus> {
        let nodes = u64::from(self.spec.nodes.max(1));
        let world = u64::from(self.world_size().max(1));
        self.executors
            .iter()
            .flat_map(Executors::records)
            .filter_map(|(id, record)| match id {
                ExecutorId::Trainer { role, rank } => Some(v1::TrainerStatus {
                    role: role.clone(),
                    rank: *rank,
                    node_id: u64::from(*rank) * nodes / world,
                    state: match record.state {
                        ExecutorState::Pending => v1::TrainerState::Pending,
                        ExecutorState::Running => v1::TrainerState::Running,
                        ExecutorState::Succeeded => v1::TrainerState::Succeeded,
                        ExecutorState::Failed => v1::TrainerState::Failed,
                    } as i32,
                    exit_code: record.exit_code,
                    restarts: record.restarts,
                }),
                ExecutorId::Daemon(_) => None,
            })
            .collect()
    }

    /// The current epoch's task table for the status page: the tasks in flight, in task order,
    /// with their progress, and the count of tasks in each state.
    pub fn task_table(&self) -> crate::status::TaskTable {
        use crate::status::{InFlightTask, TaskStateCounts, TaskTable};
        let counts = self.table.task_counts();
        let mut in_flight: Vec<InFlightTask> = self
            .table
            .tasks_in_flight()
            .map(|flight| {
                let span = flight.span;
                let split = self.plan.splits[span.split as usize];
                InFlightTask {
                    task_id: flight.task.0,
                    node_id: flight.node.0,
                    uri: self.plan.files[split.file as usize].uri.clone(),
                    first_row: split.first_row + span.start,
                    rows: span.end - span.start,
                    enqueued: flight.enqueued,
                    consumed: flight.consumed,
                }
            })
            .collect();
        in_flight.sort_unstable_by_key(|task| task.task_id);
        TaskTable {
            epoch: self.table.epoch(),
            counts: TaskStateCounts {
                pending: counts.pending,
                in_flight: counts.in_flight,
                done: counts.done,
                failed: counts.failed,
            },
            in_flight,
        }
    }
}

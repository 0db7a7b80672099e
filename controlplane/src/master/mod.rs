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
//! The master composes sub-machines, each in its own module:
//! - the task table, [`crate::decide`]: `decide(state, event) -> actions`;
//! - the rescale, `rescale`: which nodes give their rings back for a scale or a restore, and when
//!   the trainers launch again, also `decide(state, event)`;
//! - data checkpoints, [`checkpoint`]: which steps wait for ranks, which are stored and pruned, and
//!   whether a restore resets the table, also `decide(state, event)`; the position at a step is
//!   built from the ranks' reports;
//! - following sources, `following`: the sources still followed and the end of following, also
//!   `decide(state, event)`;
//! - the journal, `replay`: the [`Entry`]s, the [`Snapshot`], and rebuilding the state from them;
//! - the views, `views`: the status and the task table's view, read only.
//!
//! This module routes the daemons' calls to them and turns their actions into commands.
//!
//! # Scaling a role
//! A scale ([`Master::scale`]) is an elastic restart of the trainers that keeps every row delivered
//! exactly once. [`Entry::RoleScaled`] records the role's new size, and then:
//! 1. every trainer running retires (the service stops them); no trainer is launched meanwhile;
//! 2. once none runs, each live daemon gets [`NodeCommand::Release`] at its next call: it reports its tasks'
//!    final consumed counts in a heartbeat (the rings' read cursors, which no trainer moves any
//!    more), removes its rings with the rows still unread, and registers again holding nothing, so
//!    the task table queues every task it held again from its consumed count (the `Register`
//!    decision for a live node that no longer lists a task). Rows a trainer had read but not
//!    released are not consumed: they go to the new trainers, as after a trainer's crash;
//! 3. a daemon that registers while another still feeds rings of the old ranks is told no ranks; once
//!    none does, it gets [`NodeCommand::Release`] again, and its registration's answer names its new ranks,
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
//! role sizes: every running trainer retires, every live daemon gets [`NodeCommand::Release`] and drops the
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
//!
//! It also remembers what that checkpoint had consumed of its epoch (a bit per task consumed to its
//! end, the row of each task consumed in part), and counts those rows in every later checkpoint of
//! the epoch: the ranks that loaded it report only the tasks they read after it, so a checkpoint
//! restores at any number of ranks. A snapshot does not hold it; an AM that takes the job over
//! from one reads the checkpoint again from the store, which keeps it past `checkpoint.keep`.
//! `--resume-from` restores at the roles' sizes of the spec the AM was started with
//! ([`Master::resume_from`], journaled as [`Entry::ResumedFrom`]), and the trainers a restore
//! launches are told the checkpoint, so that each finds the job already there.

mod bad_data;
pub mod calls;
pub mod checkpoint;
mod dropped;
mod even;
mod following;
mod replay;
mod rescale;
mod sources;
mod views;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod proptests;

use crate::decide::{
    Action, DataPosition, DecideConfig, Event, JobOutcome, JobState, MixedSource, NodeId,
    NodeStatus, RestoreError, RestoreMode, TaskId, TaskSpan, decide,
};
use crate::error::{AmError, Result};
use crate::launcher::{ExecutorId, Executors, Exit, LaunchAction};
use crate::plan::JobPlan;
use crate::spec::{JobSpec, LauncherKind, OnExhausted, RoleSpec};
pub use bad_data::BadRange;
use bad_data::{BadDataLog, SkipKey};
use calls::{Heartbeat, JobPhase, NodeCommand, Registered, Registration, Scaled, TaskReport};
use checkpoint::{Checkpoints, RanksChanged};
pub use checkpoint::{CommitOutcome, ReadyCheckpoint};
use dropped::DroppedLog;
use even::EvenBatches;
use following::Follows;
pub use following::{FollowTarget, SourceFollow};
pub use replay::{Entry, Snapshot};
use rescale::{Rescale, RescaleEvent};
use sluice_proto::v1;
pub use sources::{AddedSource, JournaledSource, SourceAdded};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

/// What a node last said about its pipeline, and when the AM last heard from it.
#[derive(Debug, Clone, Default)]
struct NodeInfo {
    hostname: String,
    last_heard_ms: u64,
    stages: Vec<v1::StageStats>,
    rings: Vec<v1::RingStats>,
    tuning: Option<v1::ReadTuning>,
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
        let task = TaskId(table.first_task_id() + u64::from(slot));
        if table.is_mixed() {
            // A mixed epoch's tasks are not laid out split by split: the table keeps where each
            // planned one began, and every slot past them is a re-split piece.
            return table
                .mixed_origin(slot)
                .or_else(|| self.pieces.get(&task).copied())
                .unwrap_or(span.start);
        }
        let split = span.split as usize;
        if slot < self.planned {
            return u64::from(slot - self.first_slot[split]) * self.task_rows;
        }
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

/// What one call did: the answer for the caller and the entries to journal before answering.
#[derive(Debug)]
pub struct Applied<T> {
    /// The answer.
    pub reply: T,
    /// The changes to journal, in order.
    pub entries: Vec<Entry>,
}

impl<T> Applied<T> {
    /// The same change with its answer turned by `f`.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Applied<U> {
        Applied {
            reply: f(self.reply),
            entries: self.entries,
        }
    }
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

/// The trainers a restore to a data checkpoint launches again: each is told the checkpoint
/// (`SLUICE_RESTORED_TO`), so that loading it finds the job already there whatever the ranks
/// launched with it read meanwhile. A trainer launched again after one of these ended (a crash)
/// is not told: its checkpoint takes the job back again, as it must, since the others read on.
///
/// Rebuilt on replay from the journal's restores and launches; a snapshot does not hold it,
/// so after a takeover from one the trainers still to launch are not told, and a rank that loads
/// the checkpoint after another read on takes the job back to it once more.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RestoreRelaunch {
    /// The checkpoint's token.
    token: String,
    /// Trainers the restore launches again, not launched yet.
    pending: BTreeSet<ExecutorId>,
}

/// The AM's state: the task table and what the AM keeps beside it.
#[derive(Debug)]
pub struct Master {
    spec: Arc<JobSpec>,
    plan: Arc<JobPlan>,
    config: DecideConfig,
    table: JobState,
    origins: TaskOrigins,
    outbox: BTreeMap<NodeId, Vec<NodeCommand>>,
    nodes: BTreeMap<NodeId, NodeInfo>,
    checkpoints: Checkpoints,
    /// The trainers a restore launches again, while it does (see [`RestoreRelaunch`]).
    restore_relaunch: Option<RestoreRelaunch>,
    stop_reason: Option<String>,
    /// The last task that failed for good, and why: the cause a failed job's reason names.
    last_task_failure: Option<String>,
    shut_down: BTreeSet<NodeId>,
    throughput: Throughput,
    executors: Option<Executors>,
    follows: Follows,
    /// Why executors last ended, where their launcher knew more than the exit (an OOM kill, an
    /// eviction, an image that cannot be pulled): for the job's error, not journaled.
    exit_causes: BTreeMap<ExecutorId, String>,
    /// The files, splits, split bytes and file identities followed sources added after the stored
    /// plan, as journaled, indices counted from the first added file and split.
    added: JobPlan,
    /// Each role's number of trainers, in spec order: the spec's, or a scale's.
    role_sizes: Vec<u32>,
    rescale: Option<Rescale>,
    /// The rows the daemons skipped because they did not decode.
    bad_data: BadDataLog,
    /// The rows the rings left out of their epochs (`data.even_batches: drop`).
    dropped: DroppedLog,
    /// The sources added to the running job, after the spec's in `spec`.
    added_sources: Vec<AddedSource>,
    /// Per split, the node its last task went to: a hint for locality, rebuilt by the events a new
    /// AM replays (those before its snapshot are not), never needed to replay them.
    readers: Vec<Option<NodeId>>,
    /// The latest time of a change applied, journaled or replayed: the time a new AM's clock
    /// continues from, so that the journal's times never go back.
    latest_ms: u64,
    /// With `data.even_batches`, the epochs' batch counts as the daemons report them.
    even: Option<EvenBatches>,
}

/// What a heartbeat can change of the task table besides counts and liveness: a task done (no
/// longer in flight), a new epoch, the job's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    in_flight: usize,
    pending: usize,
    epoch: u32,
    over: bool,
}

/// Where a job's trainer ranks are fed: the ranks of its roles, in contiguous blocks over its
/// nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    sizes: Vec<u32>,
    nodes: u32,
}

impl Placement {
    /// The placement of a job as its spec starts it.
    pub fn of(spec: &JobSpec) -> Placement {
        Placement {
            sizes: spec.roles.iter().map(|role| role.num).collect(),
            nodes: spec.nodes,
        }
    }

    /// The number of trainer ranks: the processes of every role.
    pub fn world_size(&self) -> u32 {
        self.sizes.iter().sum()
    }

    /// The node that feeds trainer rank `rank`.
    pub fn node_of_rank(&self, rank: u32) -> NodeId {
        node_over(rank, self.world_size(), self.nodes)
    }

    /// The node an executor runs on: a daemon's own, or the node that feeds a trainer's rank.
    pub fn node_of(&self, id: &ExecutorId) -> u32 {
        match id {
            ExecutorId::Daemon(node) => *node,
            ExecutorId::Trainer { rank, .. } => {
                u32::try_from(self.node_of_rank(*rank).0).unwrap_or(u32::MAX)
            }
        }
    }

    /// The trainer ranks node `node` feeds.
    pub fn ranks_of(&self, node: NodeId) -> Vec<u32> {
        ranks_over(&self.sizes, self.nodes, node)
    }

    /// Every trainer as the executor that runs it, ranks numbered across `roles` (the spec's, in
    /// order) by their sizes here.
    pub fn trainer_ids(&self, roles: &[RoleSpec]) -> Vec<ExecutorId> {
        let mut rank = 0;
        let mut ids = Vec::new();
        for (role, size) in roles.iter().zip(&self.sizes) {
            for _ in 0..*size {
                ids.push(ExecutorId::Trainer {
                    role: role.name.clone(),
                    rank,
                });
                rank += 1;
            }
        }
        ids
    }
}

/// The node that feeds `rank` among `world` ranks over `nodes` nodes: the inverse of
/// [`ranks_over`].
fn node_over(rank: u32, world: u32, nodes: u32) -> NodeId {
    let nodes = u64::from(nodes.max(1));
    NodeId(u64::from(rank) * nodes / u64::from(world.max(1)))
}

fn ranks_over(sizes: &[u32], nodes: u32, node: NodeId) -> Vec<u32> {
    let nodes = u64::from(nodes.max(1));
    let world: u64 = sizes.iter().map(|size| u64::from(*size)).sum();
    (0..world)
        .filter(|rank| rank * nodes / world.max(1) == node.0)
        .map(|rank| rank as u32)
        .collect()
}

/// The job's sources as the task table mixes them, when the spec gives them weights.
fn mixed_sources(spec: &JobSpec, plan: &JobPlan) -> Option<Vec<MixedSource>> {
    let mut sources = spec
        .data
        .sources
        .iter()
        .map(|source| {
            source.mix.map(|mix| MixedSource {
                splits: Vec::new(),
                weight: mix.weight,
                ends_epoch: mix.on_exhausted == OnExhausted::EndEpoch,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    for (index, split) in plan.splits.iter().enumerate() {
        let source = plan.files[split.file as usize].source as usize;
        if let Some(mixed) = sources.get_mut(source) {
            mixed.splits.push(index as u32);
        }
    }
    Some(sources)
}

impl Master {
    /// Rebuilds the task table from `position`, over the plan's splits and the spec's mix.
    fn restored_table(
        &self,
        position: DataPosition,
        mode: RestoreMode,
    ) -> std::result::Result<JobState, RestoreError> {
        let split_rows = self.plan.split_rows();
        match mixed_sources(&self.spec, &self.plan) {
            Some(sources) => {
                JobState::restore_mixed(self.config, split_rows, &sources, position, mode)
            }
            None => JobState::restore(self.config, split_rows, position, mode),
        }
    }

    /// Plans the first epoch of a job over its planned splits.
    pub fn new(spec: Arc<JobSpec>, plan: Arc<JobPlan>) -> Result<Master> {
        let config = DecideConfig::from_spec(&spec);
        let split_rows = plan.split_rows();
        let origins = TaskOrigins::new(&split_rows, config.task_rows);
        let table = match mixed_sources(&spec, &plan) {
            Some(sources) => JobState::mixed(config, split_rows, &sources)?,
            None => JobState::new(config, split_rows)?,
        };
        let role_sizes: Vec<u32> = spec.roles.iter().map(|role| role.num).collect();
        let follows = Follows::new(&spec, &plan);
        let even = match spec.data.even_batches {
            crate::spec::EvenBatches::Off => None,
            crate::spec::EvenBatches::Pad => Some(EvenBatches::new(false, role_sizes.iter().sum())),
            crate::spec::EvenBatches::Drop => Some(EvenBatches::new(true, role_sizes.iter().sum())),
        };
        Ok(Master {
            spec,
            plan,
            config,
            table,
            origins,
            outbox: BTreeMap::new(),
            nodes: BTreeMap::new(),
            checkpoints: Checkpoints::default(),
            restore_relaunch: None,
            stop_reason: None,
            last_task_failure: None,
            shut_down: BTreeSet::new(),
            throughput: Throughput::default(),
            executors: None,
            role_sizes,
            rescale: None,
            follows,
            exit_causes: BTreeMap::new(),
            added: JobPlan::default(),
            bad_data: BadDataLog::default(),
            dropped: DroppedLog::default(),
            added_sources: Vec::new(),
            readers: Vec::new(),
            latest_ms: 0,
            even,
        })
    }

    /// Makes this AM the launcher of the job's executors: a daemon per node and the trainers of
    /// every role, ranked in role order.
    pub fn launch_executors(&mut self) {
        let daemons = (0..self.spec.nodes).map(ExecutorId::Daemon);
        let trainers = self.trainer_ids();
        self.executors = Some(Executors::new(
            daemons.chain(trainers).collect::<Vec<_>>(),
            &self.spec.failover,
        ));
    }

    /// Every trainer of the job as the executor that runs it, ranks numbered across roles in spec
    /// order.
    pub fn trainer_ids(&self) -> Vec<ExecutorId> {
        self.placement().trainer_ids(&self.spec.roles)
    }

    /// The data checkpoint that trainer `id` is launched again for, when a restore launches it
    /// (see the module's "Restoring a data checkpoint"): its launch tells it, as
    /// `SLUICE_RESTORED_TO`.
    pub fn restored_to(&self, id: &ExecutorId) -> Option<&str> {
        self.restore_relaunch
            .as_ref()
            .filter(|relaunch| relaunch.pending.contains(id))
            .map(|relaunch| relaunch.token.as_str())
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

    /// The job's splits: the ones planned at its start, then the ones followed sources added.
    pub fn plan(&self) -> &JobPlan {
        &self.plan
    }

    /// Records that an executor was started.
    pub fn executor_launched(&mut self, id: ExecutorId) -> Applied<()> {
        if let Some(executors) = &mut self.executors {
            executors.launched(&id);
        }
        if let Some(relaunch) = &mut self.restore_relaunch {
            relaunch.pending.remove(&id);
        }
        Applied {
            reply: (),
            entries: vec![Entry::ExecutorLaunched { id }],
        }
    }

    /// Records why an executor is about to be recorded as ended, when its launcher knows more
    /// than the exit, for the job's error; `None` forgets an earlier cause.
    pub fn executor_cause(&mut self, id: &ExecutorId, cause: Option<String>) {
        match cause {
            Some(cause) => self.exit_causes.insert(id.clone(), cause),
            None => self.exit_causes.remove(id),
        };
    }

    /// Records how an executor ended; the failover rules decide whether it runs again.
    pub fn executor_exited(&mut self, id: ExecutorId, exit: Exit) -> Applied<()> {
        // A daemon exits with code 0 once told that the job is over. One that did so while the job
        // goes on was told by an AM before a restore to a data checkpoint (`--resume-from` on a
        // job that ended before its AM saw the daemon go): it is needed again.
        let told_to_end = self.table.outcome().is_some() || self.ending_beside_the_table();
        if let Some(executors) = &mut self.executors {
            executors.exited(&id, exit);
            if matches!(id, ExecutorId::Daemon(_)) && exit == Exit::Code(0) && !told_to_end {
                executors.launch_again(&id);
            }
        }
        let retiring = self.trainers_retiring();
        self.rescale_step(RescaleEvent::Executors { retiring });
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

    /// Where the job's trainer ranks are fed, at its current role sizes.
    pub fn placement(&self) -> Placement {
        Placement {
            sizes: self.role_sizes.clone(),
            nodes: self.spec.nodes,
        }
    }

    /// The trainer ranks node `node` feeds: the job's ranks in contiguous blocks over its nodes.
    pub fn ranks_of(&self, node: NodeId) -> Vec<u32> {
        ranks_over(&self.role_sizes, self.spec.nodes, node)
    }

    /// What a registering node opens rings for: the ranks, the world size they belong to, and
    /// whether it serves the trainers that announce themselves instead (the external launcher,
    /// which owns the ranks). During a scale or a restore, a node waiting for the others to give
    /// their rings back opens none (a later Release brings its rings), and a node that still feeds
    /// rings of the previous ranks keeps them.
    fn ranks_told(&self, node: NodeId) -> (Vec<u32>, u32, bool) {
        let sizes = self.rescale.as_ref().map(|rescale| rescale.sizes_for(node));
        if matches!(sizes, Some(None)) {
            return (Vec::new(), self.world_size(), false);
        }
        if self.spec.launcher == LauncherKind::External {
            return (Vec::new(), self.world_size(), true);
        }
        match sizes {
            Some(None) => (Vec::new(), self.world_size(), false),
            Some(Some(Some(sizes))) => (
                ranks_over(sizes, self.spec.nodes, node),
                sizes.iter().sum(),
                false,
            ),
            None | Some(Some(None)) => (self.ranks_of(node), self.world_size(), false),
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
    pub fn scale(&mut self, role: &str, num: u32) -> Result<Applied<Scaled>> {
        if self.executors.is_none() {
            return Err(AmError::FailedPrecondition(format!(
                "role {role:?}: this AM launches no executors, so it cannot scale them; run the job with `sluice run` or `sluice submit` to let the AM launch them"
            )));
        }
        if self.spec.launcher == LauncherKind::Kubernetes {
            return Err(AmError::FailedPrecondition(format!(
                "role {role:?}: on Kubernetes a node's pod holds its trainers, created once for the ranks the spec gives; change `roles[].num` in the spec and run the job again instead"
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
        let others: u64 = self
            .role_sizes
            .iter()
            .enumerate()
            .filter(|(other, _)| *other != index)
            .map(|(_, size)| u64::from(*size))
            .sum();
        if others + u64::from(num) > u64::from(crate::spec::MAX_TRAINERS) {
            return Err(AmError::InvalidRequest(format!(
                "role {role:?}: {num} trainers would make {} in all, more than the {} a job may have; scale to at most {}",
                others + u64::from(num),
                crate::spec::MAX_TRAINERS,
                u64::from(crate::spec::MAX_TRAINERS).saturating_sub(others)
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
        let reply = Scaled { previous_num, num };
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
            return Some(format!("it {}", crate::status::state_name(state.into())));
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
        self.restore_relaunch = None;
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
        checkpoint::decide(&mut self.checkpoints, RanksChanged);
        // The rings go, and the new ones count the epoch's batches from the trainers' new start.
        let world = self.world_size();
        if let Some(even) = &mut self.even {
            even.reset(world);
        }
        let event = RescaleEvent::Started {
            previous_sizes,
            live: self.table.alive_nodes().collect(),
            restore,
            retiring: self.trainers_retiring(),
        };
        self.rescale_step(event);
    }

    /// Whether a trainer the scale replaced still runs.
    fn trainers_retiring(&self) -> bool {
        self.executors
            .as_ref()
            .is_some_and(|executors| executors.retiring().next().is_some())
    }

    /// Whether `node` is due a [`NodeCommand::Release`] (see [`Rescale::release_due`]).
    fn release_due(&self, node: NodeId) -> bool {
        self.rescale
            .as_ref()
            .is_some_and(|rescale| rescale.release_due(node, self.trainers_retiring()))
    }

    /// Applies `event` to the rescale under way; once it ends, the trainers may be launched.
    fn rescale_step(&mut self, event: RescaleEvent) {
        let Some(ended) = rescale::decide(&mut self.rescale, event) else {
            return;
        };
        if ended.restore {
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

    /// Gives every live node a full heartbeat timeout from `now_ms` to report in, as after an AM
    /// restart.
    pub fn grant_grace(&mut self, now_ms: u64) {
        self.table.grant_grace(now_ms);
    }

    /// A daemon registers, listing the tasks it still holds.
    pub fn register(&mut self, request: Registration, now_ms: u64) -> Result<Applied<Registered>> {
        let node = if request.by_host {
            self.node_of_host(&request.hostname)?
        } else {
            request.node
        };
        if !request.job_id.is_empty() && request.job_id != self.spec.name {
            return Err(AmError::FailedPrecondition(format!(
                "daemon {node} belongs to job {:?} but this AM runs job {:?}; point its --am at the AM of its job",
                request.job_id, self.spec.name
            )));
        }
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
            held: request.held,
        };
        let (mut commands, entries) = self.apply_and_log(node, event);
        // First: the rings the daemon opens start in the current epoch.
        commands.splice(0..0, self.settled_for(node));
        let (ranks, world_size, attach) = self.ranks_told(node);
        Ok(Applied {
            reply: Registered {
                node,
                commands,
                ranks,
                world_size,
                attach,
                current_epoch: self.table.epoch(),
            },
            entries,
        })
    }

    /// The node of a daemon started without a node id on host `hostname`: the node last heard
    /// from that host, so that a daemon started again on its host serves the same ranks; else the
    /// lowest node never registered; else, after an AM took the job over, the lowest node whose
    /// host it has not heard from, lost ones first (the daemons of a job started again). A node
    /// this AM heard from another host is never given, even once lost: its daemon may come back
    /// (start a replacement with `--node-id`).
    fn node_of_host(&self, hostname: &str) -> Result<NodeId> {
        if hostname.is_empty() {
            return Err(AmError::InvalidRequest(
                "a daemon started without --node-id serves the node of its host name, and this one sent none; start it with --node-id".to_owned(),
            ));
        }
        if let Some((node, _)) = self
            .nodes
            .iter()
            .find(|(_, info)| info.hostname == hostname)
        {
            return Ok(*node);
        }
        let unheard = (0..u64::from(self.spec.nodes))
            .map(NodeId)
            .filter(|node| !self.nodes.contains_key(node));
        let pick = unheard.min_by_key(|node| match self.table.node_status(*node) {
            None => 0,
            Some(NodeStatus::Lost) => 1,
            Some(NodeStatus::Alive | NodeStatus::Blacklisted) => 2,
        });
        if let Some(node) = pick {
            return Ok(node);
        }
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|(node, info)| format!("{node} on {:?}", info.hostname))
            .collect();
        Err(AmError::FailedPrecondition(format!(
            "host {hostname:?}: each of the job's {} nodes already has a host ({}); raise `nodes` in the job spec, or start this daemon with --node-id of a lost node to replace it",
            self.spec.nodes,
            hosts.join(", ")
        )))
    }

    /// Where the job stands beyond counts and liveness, to tell after a heartbeat whether it
    /// changed more ([`Master::answers_before_durable`]).
    pub fn standing(&self) -> Standing {
        Standing {
            in_flight: self.table.in_flight_count(),
            pending: self.table.pending_count(),
            epoch: self.table.epoch(),
            over: self.table.outcome().is_some(),
        }
    }

    /// Whether a heartbeat applied since `before` and answered with `commands` may be answered
    /// before its entries are durable (the durability rule of `docs/architecture.md`): it changed
    /// nothing but its tasks' counts and the node's liveness, or it also finished tasks of a daemon
    /// that `keeps_finished` until the AM's journal mark says their end is durable. Not when the
    /// answer carries a command, a task finished for a daemon that lets it go on the answer, the
    /// epoch or the job's outcome changed, or a scale or restore is under way (the daemon removes
    /// its rings once its final counts are answered).
    pub fn answers_before_durable(
        &self,
        before: Standing,
        commands: &[NodeCommand],
        keeps_finished: bool,
    ) -> bool {
        let now = self.standing();
        let finished_only = keeps_finished
            && now.in_flight <= before.in_flight
            && Standing {
                in_flight: before.in_flight,
                ..now
            } == before;
        commands.is_empty() && self.rescale.is_none() && (now == before || finished_only)
    }

    /// A daemon reports liveness, counts and pipeline statistics.
    pub fn heartbeat(&mut self, request: Heartbeat, now_ms: u64) -> Applied<Vec<NodeCommand>> {
        let node = request.node;
        // An AM that took the job over meets the live nodes here, not at their registration.
        if self.table.node_status(node).is_some() {
            let info = self.nodes.entry(node).or_default();
            info.last_heard_ms = now_ms;
            info.stages = request.stages;
            info.rings = request.rings;
            info.tuning = request.tuning;
            if !request.hostname.is_empty() {
                info.hostname = request.hostname;
            }
        }
        let mut progress = request.progress;
        if self.even.is_some() {
            // With `data.even_batches`, the rows of a task handed to its ring's writer count as
            // enqueued for the table: no re-split can cut them off, so a re-split takes rows not
            // handed yet, and a task handed to its end is never asked to stop (a ring that is full
            // while its trainer waits on a dry one holds such tasks).
            let handed: BTreeMap<TaskId, u64> = request.handed.iter().copied().collect();
            for counts in &mut progress {
                if let Some(&rows) = handed.get(&counts.task) {
                    counts.enqueued = counts.enqueued.max(rows);
                }
            }
        }
        // While rings are taken back, their counts are of rings about to go.
        if let Some(even) = &mut self.even
            && self.table.node_status(node).is_some()
            && self.rescale.is_none()
        {
            even.report(
                node,
                request.handed.into_iter().collect(),
                request.ring_batches,
            );
            // Before the counts: the heartbeat that reports the epoch's last rows consumed also
            // reports them all handed.
            even.settle(&self.table);
        }
        // Before the counts: the heartbeat may end the epoch whose tasks the skips and drops
        // belong to.
        let mut entries = self.bad_data_reported(request.bad);
        entries.extend(self.drops_reported(request.dropped));
        let event = Event::Heartbeat {
            node,
            now_ms,
            progress,
        };
        let (commands, more) = self.apply_and_log(node, event);
        entries.extend(more);
        if let Some(even) = &mut self.even {
            even.settle(&self.table);
        }
        Applied {
            reply: commands,
            entries,
        }
    }

    /// With `data.even_batches`, the settled batch counts `node` may still need; sent with every
    /// answer to its heartbeats and requests for work, apart from the commands that decide whether
    /// an answer waits for the journal: the counts follow from the daemons' reports, not from it.
    pub fn settled_for(&self, node: NodeId) -> Option<NodeCommand> {
        let current = self.table.epoch();
        let even = self.even.as_ref()?;
        Some(NodeCommand::Settled {
            current,
            epochs: even.settled_for(node, current),
            allowed: even.allowed_from(current),
        })
    }

    /// Records the skips a daemon reports that are new (and lie in their tasks' splits), and fails
    /// the job when its epoch's skipped rows pass `data.max_bad_fraction` of the epoch's rows. A skip of a task of another epoch
    /// than the current one was recorded when it was reported first, in the same heartbeat as the
    /// task's last counts.
    fn bad_data_reported(&mut self, reported: Vec<(TaskId, BadRange)>) -> Vec<Entry> {
        let mut entries = Vec::new();
        if self.table.outcome().is_some() {
            return entries;
        }
        for (task, range) in reported {
            let Some(key) = self.reported_rows(task, range.first_row, range.row_count, "skip")
            else {
                continue;
            };
            if self.bad_data.knows(&key) {
                continue;
            }
            entries.push(Entry::BadDataSkipped {
                key,
                range: range.clone(),
            });
            if let Some(reason) = self.record_bad_data(key, range) {
                entries.extend(self.fail(reason).entries);
                break;
            }
        }
        entries
    }

    /// Where rows `[first_row, first_row + row_count)` of `task` of the current epoch lie, which
    /// a daemon reports as a `what`: `None` for a task not of the epoch, and for rows outside its
    /// split, which are refused, not counted.
    fn reported_rows(
        &self,
        task: TaskId,
        first_row: u64,
        row_count: u64,
        what: &str,
    ) -> Option<SkipKey> {
        let span = task
            .0
            .checked_sub(self.table.first_task_id())
            .and_then(|index| u32::try_from(index).ok())
            .and_then(|index| self.table.task_span(index))?;
        let split_rows = self
            .plan
            .splits
            .get(span.split as usize)
            .map_or(0, |split| split.row_count);
        if first_row
            .checked_add(row_count)
            .is_none_or(|end| row_count == 0 || end > split_rows)
        {
            tracing::warn!(
                task = task.0,
                first_row,
                rows = row_count,
                split_rows,
                "a {what} reported outside its task's split is refused"
            );
            return None;
        }
        Some(SkipKey {
            epoch: self.table.epoch(),
            split: span.split,
            first_row,
        })
    }

    /// Records the drops a daemon reports that are new (`data.even_batches: drop`), journaled.
    fn drops_reported(&mut self, reported: Vec<(TaskId, (u64, u64))>) -> Vec<Entry> {
        let mut entries = Vec::new();
        for (task, (first_row, rows)) in reported {
            let Some(key) = self.reported_rows(task, first_row, rows, "drop") else {
                continue;
            };
            if self.dropped.knows(&key) {
                continue;
            }
            tracing::info!(
                epoch = key.epoch,
                split = key.split,
                first_row,
                rows,
                "rows left out of the epoch to keep the rings' batch counts equal (data.even_batches: drop)"
            );
            entries.push(Entry::RowsDropped { key, rows });
            self.dropped.record(key, rows);
        }
        entries
    }

    /// With `data.even_batches: drop`, once the table moved on from `ended`: the rows `ended`
    /// dropped, to hand out first. Without a shuffle a split's rows come in the same order in
    /// every epoch, so the dropped rows are cut out of their tasks into tasks of their own, read
    /// first; with one, each epoch permutes a split's rows anew, and every task of a split with a
    /// drop may hold its rows, so those tasks come first whole. A mixed epoch, whose tasks are not
    /// laid out split by split, brings the tasks whose rows overlap a drop first whole.
    fn dropped_first(&self, ended: u32) -> Option<Event> {
        let shuffled = self.spec.data.shuffle.enabled;
        let drops: Vec<&(SkipKey, u64)> = self.dropped.of_epoch(ended).collect();
        if drops.is_empty() {
            return None;
        }
        if !shuffled && !self.table.is_mixed() {
            return Some(Event::CarveFront {
                rows: self.carved_drops(ended),
            });
        }
        let first = self.table.first_task_id();
        let tasks: Vec<TaskId> = self
            .table
            .task_spans()
            .enumerate()
            .filter(|(_, (span, _))| {
                drops.iter().any(|(key, rows)| {
                    key.split == span.split
                        && (shuffled
                            || (span.start < key.first_row.saturating_add(*rows)
                                && key.first_row < span.end))
                })
            })
            .map(|(index, _)| TaskId(first + index as u64))
            .collect();
        (!tasks.is_empty()).then_some(Event::Front { tasks })
    }

    /// The rows `epoch` dropped, merged, which the next epoch cuts out of their tasks to read
    /// first (`data.even_batches: drop` without a shuffle, in an epoch not mixed); none otherwise.
    fn carved_drops(&self, epoch: u32) -> Vec<TaskSpan> {
        if self.spec.data.shuffle.enabled || self.table.is_mixed() {
            return Vec::new();
        }
        // A ring's drops are a batch each: the rows of a task's last batches.
        let mut spans: Vec<TaskSpan> = self
            .dropped
            .of_epoch(epoch)
            .map(|(key, rows)| TaskSpan {
                split: key.split,
                start: key.first_row,
                end: key.first_row.saturating_add(*rows),
            })
            .collect();
        spans.sort_unstable_by_key(|span| (span.split, span.start));
        let mut merged: Vec<TaskSpan> = Vec::with_capacity(spans.len());
        for span in spans {
            match merged.last_mut() {
                Some(last) if last.split == span.split && span.start <= last.end => {
                    last.end = last.end.max(span.end);
                }
                _ => merged.push(span),
            }
        }
        merged
    }

    /// Records a skip; returns why the job fails when the epoch's skipped rows pass the budget.
    fn record_bad_data(&mut self, key: SkipKey, range: BadRange) -> Option<String> {
        let policy = self.spec.data.bad_data;
        if policy.policy == crate::spec::BadDataPolicy::Warn {
            tracing::warn!(
                epoch = key.epoch,
                rows = range.row_count,
                cause = %range.cause,
                "skipped {} as bad data",
                range.place()
            );
        }
        let place = range.place();
        let cause = range.cause.clone();
        let skipped = self.bad_data.record(key, range);
        let epoch_rows = self.table.epoch_rows();
        (skipped as f64 > policy.max_fraction * epoch_rows as f64).then(|| {
            format!(
                "epoch {}: {skipped} rows skipped as bad data, {:.2}% of the epoch's {epoch_rows}, pass data.max_bad_fraction ({}); the last: {place}: {cause}",
                key.epoch,
                skipped as f64 * 100.0 / epoch_rows.max(1) as f64,
                policy.max_fraction
            )
        })
    }

    /// A daemon asks for more tasks; `dry` is whether one of its rings has nothing left to write.
    pub fn acquire(
        &mut self,
        node: NodeId,
        max_tasks: u32,
        dry: bool,
        now_ms: u64,
    ) -> Applied<Vec<NodeCommand>> {
        self.heard_from(node, now_ms);
        if self.rescale.as_ref().is_some_and(|rescale| rescale.restore)
            && !self.ending_beside_the_table()
        {
            // The rings are about to be taken back: a task handed out now could be read by a
            // trainer that is being stopped, and its rows would count as consumed.
            let mut commands = self.outbox.remove(&node).unwrap_or_default();
            if self.release_due(node) {
                commands.insert(0, NodeCommand::Release);
            }
            return Applied {
                reply: commands,
                entries: Vec::new(),
            };
        }
        // Tasks of splits this node read last come first (locality: its cache may hold their
        // blocks), but after the rows the epoch before dropped, which come first for every node.
        // The event carries them, so that a replay hands out what this AM did.
        let owed = self
            .table
            .epoch()
            .checked_sub(1)
            .map_or_else(Vec::new, |before| self.carved_drops(before));
        let near: Vec<TaskId> = self
            .table
            .pending_window()
            .filter(|(_, span)| {
                self.readers.get(span.split as usize) == Some(&Some(node))
                    || owed.iter().any(|rows| {
                        rows.split == span.split && rows.start <= span.start && span.end <= rows.end
                    })
            })
            .map(|(task, _)| task)
            .collect();
        let event = if self.config.even_batches {
            Event::AcquireEven {
                node,
                now_ms,
                max_tasks,
                near,
                dry,
            }
        } else if near.is_empty() {
            Event::Acquire {
                node,
                now_ms,
                max_tasks,
            }
        } else {
            Event::AcquireNear {
                node,
                now_ms,
                max_tasks,
                near,
            }
        };
        let (commands, entries) = self.apply_and_log(node, event);
        Applied {
            reply: commands,
            entries,
        }
    }

    /// A daemon ends a task.
    pub fn report(&mut self, report: TaskReport, now_ms: u64) -> Applied<Vec<NodeCommand>> {
        let node = report.node;
        self.heard_from(node, now_ms);
        let event = Event::Report {
            node,
            now_ms,
            task: report.task,
            consumed: report.consumed,
            outcome: report.outcome,
        };
        let (commands, entries) = self.apply_and_log(node, event);
        Applied {
            reply: commands,
            entries,
        }
    }

    /// A daemon acknowledges a stop request with the row where it really stops.
    pub fn ack_stop(
        &mut self,
        node: NodeId,
        task: TaskId,
        stop_row: u64,
        now_ms: u64,
    ) -> Applied<Vec<NodeCommand>> {
        self.heard_from(node, now_ms);
        let event = Event::StopAck {
            node,
            now_ms,
            task,
            stop_row,
        };
        let (commands, entries) = self.apply_and_log(node, event);
        Applied {
            reply: commands,
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

    /// Fails the job for `reason`, a cause outside the task table (a trainer that hangs).
    pub fn fail(&mut self, reason: String) -> Applied<()> {
        let event = Event::Failed { reason };
        let entries = vec![Entry::Event(event.clone())];
        self.apply_event(None, event);
        Applied { reply: (), entries }
    }

    /// Asks the job to stop. A job that still follows a source stops following it and ends once
    /// the rows already planned are consumed; any other job shuts every daemon down at its next
    /// call.
    pub fn stop(&mut self, reason: String) -> Applied<JobPhase> {
        if self.table.outcome().is_some() || self.stop_reason.is_some() {
            return Applied {
                reply: self.phase(),
                entries: Vec::new(),
            };
        }
        if self.table.following() {
            let sources: Vec<u32> = self.follows.following().collect();
            let mut entries = Vec::new();
            for source in sources {
                entries.extend(self.end_follow(source, reason.clone()).entries);
            }
            return Applied {
                reply: self.phase(),
                entries,
            };
        }
        self.stop_reason = Some(reason.clone());
        Applied {
            reply: self.phase(),
            entries: vec![Entry::StopRequested { reason }],
        }
    }

    fn heard_from(&mut self, node: NodeId, now_ms: u64) {
        if let Some(info) = self.nodes.get_mut(&node) {
            info.last_heard_ms = now_ms;
        }
    }

    /// Applies an event for `caller` and returns its commands and the entry to journal.
    fn apply_and_log(&mut self, caller: NodeId, event: Event) -> (Vec<NodeCommand>, Vec<Entry>) {
        if self.ending_beside_the_table() {
            self.shut_down.insert(caller);
            let mut commands = self.outbox.remove(&caller).unwrap_or_default();
            commands.push(NodeCommand::Shutdown);
            return (commands, Vec::new());
        }
        let epoch = self.table.epoch();
        let mut entries = vec![Entry::Event(event.clone())];
        let mut commands = self.apply_event(Some(caller), event);
        if self.table.epoch() > epoch
            && let Some(front) = self.dropped_first(epoch)
        {
            entries.push(Entry::Event(front.clone()));
            commands.extend(self.apply_event(Some(caller), front));
        }
        if self.release_due(caller) {
            // First: the commands after it are for the rings the daemon gives back.
            commands.insert(0, NodeCommand::Release);
        }
        (commands, entries)
    }

    /// Applies an event; returns the commands for `caller`, queueing those for other nodes.
    fn apply_event(&mut self, caller: Option<NodeId>, event: Event) -> Vec<NodeCommand> {
        if let Some(now_ms) = event.now_ms() {
            self.latest_ms = self.latest_ms.max(now_ms);
        }
        let registration = match &event {
            Event::Register { node, held, .. } => Some((*node, held.is_empty())),
            _ => None,
        };
        let actions = decide(&mut self.table, event);
        if let Some((node, held_nothing)) = registration
            && self.table.node_status(node) == Some(NodeStatus::Alive)
        {
            let retiring = self.trainers_retiring();
            self.rescale_step(RescaleEvent::Registered {
                node,
                held_nothing,
                retiring,
            });
        }
        let mut mine = caller
            .and_then(|node| self.outbox.remove(&node))
            .unwrap_or_default();
        for action in actions {
            let (node, command) = match action {
                Action::Assign { node, tasks } | Action::Resume { node, tasks } => {
                    for task in &tasks {
                        let split = task.split as usize;
                        if self.readers.len() <= split {
                            self.readers.resize(split + 1, None);
                        }
                        self.readers[split] = Some(node);
                    }
                    (node, NodeCommand::Assign(tasks))
                }
                Action::StopAt { node, task, row } => {
                    tracing::debug!(%node, %task, row, "stop requested");
                    (node, NodeCommand::Stop { task, row })
                }
                Action::Fence { node } => (node, NodeCommand::Fence),
                Action::Refuse { node, reason } => (node, NodeCommand::Refuse(reason)),
                Action::Shutdown { node } => {
                    self.shut_down.insert(node);
                    (node, NodeCommand::Shutdown)
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
                let retiring = self.trainers_retiring();
                self.rescale_step(RescaleEvent::Gone { node, retiring });
            }
            Action::NodeBlacklisted { node, requeued } => {
                tracing::warn!(%node, requeued, "node blacklisted after repeated task failures");
                let retiring = self.trainers_retiring();
                self.rescale_step(RescaleEvent::Gone { node, retiring });
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
        self.table.rows_before_epoch() + self.table.done_rows()
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

    /// The job's final phase once it has one. With executors, the job succeeds when every
    /// trainer has exited with success; without, when the task table does.
    pub fn outcome(&self) -> Option<JobPhase> {
        if let Some(JobOutcome::Failed { .. }) = self.table.outcome() {
            return Some(JobPhase::Failed);
        }
        match &self.executors {
            Some(executors) if executors.failure().is_some() => {
                return Some(JobPhase::Failed);
            }
            Some(executors) if executors.trainers_succeeded() => {
                return Some(JobPhase::Succeeded);
            }
            Some(_) if self.stop_reason.is_some() => return Some(JobPhase::Stopped),
            Some(_) => return None,
            None => {}
        }
        match (self.table.outcome(), &self.stop_reason) {
            (Some(_), _) => Some(JobPhase::Succeeded),
            (None, Some(_)) => Some(JobPhase::Stopped),
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
        let failure = self.executors.as_ref()?.failure()?;
        let cause = self
            .exit_causes
            .iter()
            .find(|(id, _)| failure.starts_with(&format!("{id} failed")));
        Some(match cause {
            Some((id, cause)) => format!("{failure}; {id} last ended: {cause}"),
            None => failure.to_owned(),
        })
    }

    /// Where the job stands as a whole.
    pub fn phase(&self) -> JobPhase {
        match self.outcome() {
            Some(phase) if self.all_shut_down() => phase,
            Some(JobPhase::Stopped) => JobPhase::Stopping,
            Some(phase) => phase,
            None if self.stop_reason.is_some() => JobPhase::Stopping,
            None if self.nodes.is_empty() => JobPhase::Starting,
            None => JobPhase::Running,
        }
    }

    /// Whether the job is over and every live daemon was told to shut down, so the AM may exit.
    pub fn finished(&self) -> bool {
        self.outcome().is_some() && self.all_shut_down()
    }

    /// Stops waiting for node `node` to hear that the job is over: its daemon hangs and will not
    /// call again.
    pub fn give_up_on(&mut self, node: NodeId) {
        self.shut_down.insert(node);
    }

    fn all_shut_down(&self) -> bool {
        self.table
            .alive_nodes()
            .all(|node| self.shut_down.contains(&node))
    }
}

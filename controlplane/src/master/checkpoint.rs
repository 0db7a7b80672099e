//! Data checkpoints: the task table as it stood at a trainer step; the master's calls that commit
//! them rank by rank, store them, and restore the table to one (see the
//! [master's documentation](super#restoring-a-data-checkpoint)).
//!
//! # Implementation
//! Every rank of a step reports, for each task of its epoch it has read rows of, the split row up to
//! which it consumed the task (`end_row`, exclusive; finished tasks included). A task feeds exactly
//! one ring and its rows are consumed as a prefix, even across holders (a task taken back from a lost
//! node is queued again from its consumed count), so the largest `end_row` any rank reports is the
//! task's consumed prefix at the step. The position at the step follows from those counts alone:
//! rows `[origin, end_row)` of a task are consumed, where `origin` is where the task began in its
//! epoch (its planned start, or the row a re-split cut it at), and a task no rank reported is
//! untouched. What happened after the step (tasks finished, failed or cut later) does not leak into
//! the checkpoint: a cut after the step leaves both pieces in the table, and the counts fall in the
//! parent piece.

use super::calls::{RankCommit, RestoreEffect, Restored};
use super::{Applied, Entry, Master, RestoreRelaunch, TaskOrigins};
use crate::decide::{
    DataPosition, JobState, NodeRecord, RestoreMode, TaskId, TaskRecord, TaskStatus,
};
use crate::error::{AmError, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The data checkpoint the task table was last reset to, and the rows consumed right after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct RestoredAt {
    token: String,
    /// [`Master::rows_consumed_total`] right after the reset.
    rows_consumed: u64,
}

/// A step's data checkpoint while ranks are still reporting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct PendingCheckpoint {
    world_size: u32,
    epoch: u32,
    ranks: BTreeMap<u32, RankPositions>,
}

/// The data checkpoints of a job: the steps whose ranks are still reporting, the stored ones by
/// step, and the one the task table was last reset to.
///
/// Pure like the task table's [`decide`](crate::decide::decide): [`decide`] takes the checkpoints
/// and one [`CheckpointEvent`], changes them, and says what the master does next. Building a
/// step's position from the ranks' reports is left to the master ([`position_at_step`]), since it
/// reads the task table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Checkpoints {
    pending: BTreeMap<u64, PendingCheckpoint>,
    stored: BTreeMap<u64, String>,
    restored: Option<RestoredAt>,
    /// What the checkpoint of `restored` had consumed, while it is known: set by a reset, and by
    /// the service from the stored checkpoint after a snapshot (which does not hold it).
    floor: Option<ConsumedFloor>,
    /// The ranks that asked for the restore to `restored`, when they said which they are (trainers
    /// that no AM launched each ask). Kept by this AM alone: what it decides from them changes
    /// nothing the journal holds, and a new AM without them resets the job as an earlier release
    /// did.
    loaded: BTreeSet<u32>,
    /// The steps whose every rank reported, while the service stores them: a report repeated
    /// meanwhile waits for the token, instead of completing the step a second time (at a later
    /// state of the table, so under another token). Kept by this AM alone, as `loaded` is.
    completing: BTreeSet<u64>,
}

/// The rows of its epoch a restored data checkpoint had consumed: they are consumed at every later
/// step of that epoch, whoever reads on. The ranks that load the checkpoint report only the tasks
/// they read after it (at another world size they have no positions of their own to carry), so the
/// master counts these rows itself when it builds a later step's position.
///
/// Held compactly: a bit per task consumed to its end, and the row of each task consumed in part,
/// which are the tasks in progress at the checkpoint's step, bounded by the rings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ConsumedFloor {
    epoch: u32,
    first_task_id: u64,
    /// Bit `slot` is set when the task of `slot` was consumed to its end.
    done: Vec<u64>,
    /// The row up to which a task consumed in part was consumed, by slot.
    partial: BTreeMap<u32, u64>,
}

impl ConsumedFloor {
    /// The floor of a position of `epoch` whose tasks, from `first_task_id` on, are `tasks`
    /// (`(done, start)`: consumed to its end, or up to `start`), with `origin` giving where the
    /// task of a slot began in its epoch.
    pub(super) fn new(
        epoch: u32,
        first_task_id: u64,
        tasks: impl Iterator<Item = (bool, u64)>,
        origin: impl Fn(u32) -> u64,
    ) -> ConsumedFloor {
        let mut done = Vec::new();
        let mut partial = BTreeMap::new();
        for (slot, (task_done, start)) in tasks.enumerate() {
            let slot = slot as u32;
            let word = slot as usize / 64;
            if done.len() <= word {
                done.push(0u64);
            }
            if task_done {
                done[word] |= 1 << (slot % 64);
            } else if start > origin(slot) {
                partial.insert(slot, start);
            }
        }
        ConsumedFloor {
            epoch,
            first_task_id,
            done,
            partial,
        }
    }

    /// The row up to which the task of `slot` was consumed at the checkpoint, if any of it was;
    /// `end` is the task's last row, which a task consumed to its end was consumed up to.
    fn row(&self, slot: u32, end: u64) -> Option<u64> {
        let done = self
            .done
            .get(slot as usize / 64)
            .is_some_and(|word| word & (1 << (slot % 64)) != 0);
        if done {
            Some(end)
        } else {
            self.partial.get(&slot).copied()
        }
    }

    /// Whether the floor is of the table's epoch, whose tasks it numbers.
    fn applies_to(&self, table: &JobState, epoch: u32) -> bool {
        self.epoch == epoch && self.first_task_id == table.first_task_id()
    }
}

/// The parts of [`Checkpoints`] as the journal's snapshots hold them.
pub(super) type CheckpointParts = (
    BTreeMap<u64, PendingCheckpoint>,
    BTreeMap<u64, String>,
    Option<RestoredAt>,
);

/// What happened that the data checkpoints follow; each kind of event is answered by its own
/// kind of action.
pub(super) trait CheckpointEvent {
    /// What the master does after the event: a `Result` for an event that can be refused.
    type Action;

    /// Applies the event to `state`; an event that is refused changes nothing.
    fn apply(self, state: &mut Checkpoints) -> Self::Action;
}

/// Applies `event` to the checkpoints and says what the master does next; a report or a restore
/// that cannot be taken is an error that changes nothing.
pub(super) fn decide<E: CheckpointEvent>(state: &mut Checkpoints, event: E) -> E::Action {
    event.apply(state)
}

/// A rank reported its position at a step.
#[derive(Debug)]
pub(super) struct RankReported {
    /// The trainer's step.
    pub(super) step: u64,
    /// The rank.
    pub(super) rank: u32,
    /// Ranks that report for the step.
    pub(super) world_size: u32,
    /// The rank's epoch.
    pub(super) epoch: u32,
    /// Split row up to which the rank consumed each task it read.
    pub(super) positions: RankPositions,
    /// Why the report does not fit the task table ([`check_report`]), if it does not: it is
    /// refused unless the step was stored already.
    pub(super) problem: Option<AmError>,
}

/// What the master does after a rank's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ReportAction {
    /// The step waits for other ranks.
    Pending {
        /// Ranks reported so far.
        reported: u32,
        /// Ranks that must report.
        world_size: u32,
    },
    /// The step was stored before, under this token: the report changes nothing.
    AlreadyStored(String),
    /// The report completes the step: the master builds its position from every rank's report
    /// ([`Checkpoints::reports`]) and stores it. The reports stay until it is stored, so that any
    /// rank's next commit completes the step again if storing it failed.
    Complete {
        /// The step's epoch.
        epoch: u32,
    },
}

impl CheckpointEvent for RankReported {
    type Action = Result<ReportAction>;

    fn apply(self, state: &mut Checkpoints) -> Result<ReportAction> {
        let RankReported {
            step,
            rank,
            world_size,
            epoch,
            positions,
            problem,
        } = self;
        if let Some(token) = state.stored.get(&step) {
            return Ok(ReportAction::AlreadyStored(token.clone()));
        }
        if let Some(problem) = problem {
            return Err(problem);
        }
        if world_size == 0 || rank >= world_size {
            return Err(AmError::InvalidRequest(format!(
                "data checkpoint of step {step}: rank {rank} is not below world size {world_size}; pass SLUICE_RANK and SLUICE_WORLD_SIZE as the AM set them"
            )));
        }
        if let Some(pending) = state.pending.get(&step)
            && (pending.world_size != world_size || pending.epoch != epoch)
        {
            return Err(AmError::InvalidRequest(format!(
                "data checkpoint of step {step}: rank {rank} reports world size {world_size} in epoch {epoch}, but other ranks reported world size {} in epoch {}; every rank must checkpoint the same step",
                pending.world_size, pending.epoch
            )));
        }
        let pending = state
            .pending
            .entry(step)
            .or_insert_with(|| PendingCheckpoint {
                world_size,
                epoch,
                ranks: BTreeMap::new(),
            });
        pending.ranks.insert(rank, positions);
        if pending.ranks.len() < world_size as usize || !state.completing.insert(step) {
            return Ok(ReportAction::Pending {
                reported: pending.ranks.len() as u32,
                world_size,
            });
        }
        Ok(ReportAction::Complete { epoch })
    }
}

/// The checkpoint of `step` was stored under `token`; at most `keep` stay stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stored {
    /// The trainer's step.
    pub(super) step: u64,
    /// The token that names it.
    pub(super) token: String,
    /// How many stored checkpoints to keep, `None` for all.
    pub(super) keep: Option<u32>,
}

impl CheckpointEvent for Stored {
    /// The tokens of the stored checkpoints now past `keep`, oldest first: the master deletes
    /// their objects.
    type Action = Vec<String>;

    fn apply(self, state: &mut Checkpoints) -> Vec<String> {
        state.pending.remove(&self.step);
        state.completing.remove(&self.step);
        state.stored.insert(self.step, self.token);
        // The checkpoint the table was reset to stays besides the newest `keep`: what it consumed
        // counts in every later step of its epoch, and an AM that takes the job over reads it.
        let standing_on = state.restored.as_ref().map(|at| at.token.as_str());
        let exempt = state
            .stored
            .values()
            .any(|token| Some(token.as_str()) == standing_on);
        let keep = self.keep.map_or(usize::MAX, |keep| keep as usize);
        let excess = state
            .stored
            .len()
            .saturating_sub(keep.saturating_add(usize::from(exempt)));
        let oldest: Vec<u64> = state
            .stored
            .iter()
            .filter(|(_, token)| Some(token.as_str()) != standing_on)
            .map(|(step, _)| *step)
            .take(excess)
            .collect();
        oldest
            .into_iter()
            .filter_map(|step| state.stored.remove(&step))
            .collect()
    }
}

/// A restore to `token` was asked while `rows_consumed` rows are consumed in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RestoreAsked {
    /// The checkpoint's token.
    pub(super) token: String,
    /// The rows the job has consumed in all.
    pub(super) rows_consumed: u64,
    /// The rank asking, when it says.
    pub(super) rank: Option<u32>,
}

/// What the master does after a restore was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RestoreAction {
    /// The job stands at that checkpoint, with no row consumed since: change nothing.
    AlreadyThere,
    /// Reset the task table to the checkpoint.
    Reset,
}

impl CheckpointEvent for RestoreAsked {
    type Action = Result<RestoreAction>;

    fn apply(self, state: &mut Checkpoints) -> Result<RestoreAction> {
        let RestoreAsked {
            token,
            rows_consumed,
            rank,
        } = self;
        // A rank that had not asked yet for the restore the job stands at is one of its ranks
        // coming late, after others read on: it reads on too. One that asks again started over.
        let late = |rank: Option<u32>| rank.is_some_and(|rank| !state.loaded.contains(&rank));
        let action = match &state.restored {
            Some(at) if at.rows_consumed == rows_consumed && at.token != token => {
                return Err(AmError::FailedPrecondition(format!(
                    "data checkpoint {token}: the job was restored to data checkpoint {} and no row was consumed since, so the ranks loaded different checkpoints ({} and {token}); load the states that every rank saved at the same step",
                    at.token, at.token
                )));
            }
            Some(at) if at.token == token && (at.rows_consumed == rows_consumed || late(rank)) => {
                RestoreAction::AlreadyThere
            }
            _ => {
                state.loaded.clear();
                RestoreAction::Reset
            }
        };
        state.loaded.extend(rank);
        Ok(action)
    }
}

/// The task table was reset to `token`, with `rows_consumed` rows consumed in all after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ResetTo {
    /// The checkpoint's token.
    pub(super) token: String,
    /// The rows the job has consumed in all after the reset.
    pub(super) rows_consumed: u64,
    /// What the checkpoint had consumed of its epoch.
    pub(super) floor: ConsumedFloor,
}

impl CheckpointEvent for ResetTo {
    /// The tokens of the stored checkpoints the reset forgot.
    type Action = Vec<String>;

    fn apply(self, state: &mut Checkpoints) -> Vec<String> {
        state.pending.clear();
        state.completing.clear();
        // The steps stored after the checkpoint reset to belong to the run it left: the trainers
        // count their steps again from the checkpoint's, and a step they commit anew is a new
        // position, never the token of the old one. Those steps are forgotten (all of them but the
        // checkpoint's own when this AM did not store it).
        let from = state.step_of(&self.token);
        let (kept, forgotten) =
            std::mem::take(&mut state.stored)
                .into_iter()
                .partition(|(step, stored)| {
                    *stored == self.token || from.is_some_and(|from| *step <= from)
                });
        state.stored = kept;
        state.restored = Some(RestoredAt {
            token: self.token,
            rows_consumed: self.rows_consumed,
        });
        state.floor = Some(self.floor);
        forgotten.into_values().collect()
    }
}

/// The ranks changed (a scale, a restore): the steps still reporting can no longer complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RanksChanged;

impl CheckpointEvent for RanksChanged {
    type Action = ();

    fn apply(self, state: &mut Checkpoints) {
        state.pending.clear();
        state.completing.clear();
    }
}

/// Storing the checkpoint of `step` failed: the next report of the step completes it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct StoreFailed {
    /// The trainer's step.
    pub(super) step: u64,
}

impl CheckpointEvent for StoreFailed {
    type Action = ();

    fn apply(self, state: &mut Checkpoints) {
        state.completing.remove(&self.step);
    }
}

impl Checkpoints {
    /// The checkpoints as a snapshot left them.
    pub(super) fn from_parts((pending, stored, restored): CheckpointParts) -> Checkpoints {
        Checkpoints {
            pending,
            stored,
            restored,
            floor: None,
            loaded: BTreeSet::new(),
            completing: BTreeSet::new(),
        }
    }

    /// The parts a snapshot holds.
    pub(super) fn to_parts(&self) -> CheckpointParts {
        (
            self.pending.clone(),
            self.stored.clone(),
            self.restored.clone(),
        )
    }

    /// The token of the checkpoint the table was last reset to, when what it consumed is not
    /// known: the service then reads it from the store and gives it ([`Checkpoints::set_floor`]).
    pub(super) fn floor_missing(&self) -> Option<&str> {
        match (&self.restored, &self.floor) {
            (Some(at), None) => Some(&at.token),
            _ => None,
        }
    }

    /// Sets what the checkpoint the table was last reset to had consumed.
    pub(super) fn set_floor(&mut self, floor: ConsumedFloor) {
        self.floor = Some(floor);
    }

    /// What the checkpoint the table was last reset to had consumed, if known.
    pub(super) fn floor(&self) -> Option<&ConsumedFloor> {
        self.floor.as_ref()
    }

    /// The reports of a step still waiting to be stored, by rank.
    pub(super) fn reports(&self, step: u64) -> Option<&BTreeMap<u32, RankPositions>> {
        self.pending.get(&step).map(|pending| &pending.ranks)
    }

    /// The step whose checkpoint is stored under `token`, if this AM stored it.
    pub(super) fn step_of(&self, token: &str) -> Option<u64> {
        self.stored
            .iter()
            .find(|(_, stored)| *stored == token)
            .map(|(step, _)| *step)
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

/// One rank's report for a step: the split row up to which it consumed each task it read.
pub type RankPositions = BTreeMap<TaskId, u64>;

/// Checks a report of the rows consumed at a step against the current table: the job is still in
/// the report's epoch, and every task it names is a task of that epoch, reported consumed up to a
/// row within the task's rows.
pub fn check_report(
    table: &JobState,
    origins: &TaskOrigins,
    epoch: u32,
    positions: &RankPositions,
) -> Result<()> {
    if table.epoch() != epoch {
        return Err(AmError::FailedPrecondition(format!(
            "data checkpoint of epoch {epoch}: the job has moved on to epoch {}; commit a checkpoint at a later step",
            table.epoch()
        )));
    }
    let first = table.first_task_id();
    for (task, end_row) in positions {
        let span = task
            .0
            .checked_sub(first)
            .and_then(|slot| u32::try_from(slot).ok())
            .and_then(|slot| Some((slot, table.task_span(slot)?)));
        let Some((slot, span)) = span else {
            return Err(AmError::InvalidRequest(format!(
                "data checkpoint: {task} is not a task of epoch {epoch}; report only the tasks of the current epoch"
            )));
        };
        let origin = origins.origin(table, slot);
        if *end_row < origin || *end_row > span.end {
            return Err(AmError::InvalidRequest(format!(
                "data checkpoint: {task} is reported consumed up to row {end_row}, outside its rows [{origin}, {})",
                span.end
            )));
        }
    }
    Ok(())
}

/// Builds the data position of `epoch` at a step from the ranks' reports, over the tasks of the
/// current table. Every task not fully consumed is pending, tasks in progress at the step first.
pub(super) fn position_at_step(
    table: &JobState,
    origins: &TaskOrigins,
    floor: Option<&ConsumedFloor>,
    epoch: u32,
    ranks: &BTreeMap<u32, RankPositions>,
) -> Result<DataPosition> {
    let mut consumed_to: RankPositions = BTreeMap::new();
    for positions in ranks.values() {
        for (task, end_row) in positions {
            let entry = consumed_to.entry(*task).or_insert(*end_row);
            *entry = (*entry).max(*end_row);
        }
    }
    check_report(table, origins, epoch, &consumed_to)?;
    let current = table.position();
    let first = current.first_task_id;
    let floor = floor.filter(|floor| floor.applies_to(table, epoch));

    let mut started = Vec::new();
    let mut tasks = Vec::with_capacity(current.tasks.len());
    let mut done_rows = 0u64;
    for (index, record) in current.tasks.iter().enumerate() {
        let task = TaskId(first + index as u64);
        let origin = origins.origin(table, index as u32);
        let reported = consumed_to.get(&task).copied().unwrap_or(origin);
        let end_row = floor
            .and_then(|floor| floor.row(index as u32, record.end))
            .map_or(reported, |row| row.max(reported).min(record.end));
        done_rows += end_row - origin;
        let was_started = end_row > origin || matches!(record.status, TaskStatus::InFlight { .. });
        let status = if end_row == record.end {
            TaskStatus::Done
        } else {
            if was_started {
                started.push(task);
            }
            TaskStatus::Pending
        };
        tasks.push(TaskRecord {
            split: record.split,
            start: end_row,
            end: record.end,
            failures: record.failures,
            status,
        });
    }

    let mut pending = started.clone();
    let mut listed: std::collections::BTreeSet<TaskId> = started.iter().copied().collect();
    let queued_in_order = current.pending.iter().copied();
    let others = (0..tasks.len() as u64).map(|index| TaskId(first + index));
    for task in queued_in_order.chain(others) {
        let index = (task.0 - first) as usize;
        if tasks[index].status == TaskStatus::Pending && listed.insert(task) {
            pending.push(task);
        }
    }
    Ok(DataPosition {
        epoch,
        first_task_id: first,
        tasks,
        requeued: started.len(),
        pending,
        nodes: current.nodes,
        done_rows,
        failed_rows: 0,
        total_failures: current.total_failures,
        outcome: None,
        splits: current.splits,
        following: current.following,
    })
}

impl Master {
    /// Records one rank's data position at a step.
    pub fn commit_checkpoint(&mut self, commit: RankCommit) -> Result<Applied<CommitOutcome>> {
        let RankCommit {
            step,
            rank,
            world_size,
            epoch,
            positions,
        } = commit;
        let positions: RankPositions = positions.into_iter().collect();
        let problem = check_report(&self.table, &self.origins, epoch, &positions).err();
        let entry = Entry::RankCommitted {
            step,
            rank,
            world_size,
            epoch,
            positions: positions.clone(),
        };
        let report = RankReported {
            step,
            rank,
            world_size,
            epoch,
            positions,
            problem,
        };
        let reply = match decide(&mut self.checkpoints, report)? {
            ReportAction::AlreadyStored(token) => {
                return Ok(Applied {
                    reply: CommitOutcome::Stored(token),
                    entries: Vec::new(),
                });
            }
            ReportAction::Pending {
                reported,
                world_size,
            } => CommitOutcome::Pending {
                reported,
                world_size,
            },
            ReportAction::Complete { epoch } => {
                let ranks = self.checkpoints.reports(step).ok_or_else(|| {
                    AmError::FailedPrecondition(format!(
                        "data checkpoint of step {step}: its reports are gone; commit it again"
                    ))
                })?;
                let position = position_at_step(
                    &self.table,
                    &self.origins,
                    self.checkpoints.floor(),
                    epoch,
                    ranks,
                )?;
                let digest = crc32c::crc32c(
                    &serde_json::to_vec(&position).expect("a data position serializes to JSON"),
                );
                CommitOutcome::Ready(ReadyCheckpoint {
                    step,
                    token: format!("{}-step{step}-{digest:08x}", self.spec.name),
                    position,
                })
            }
        };
        Ok(Applied {
            reply,
            entries: vec![entry],
        })
    }

    /// Replays a rank's report. The report was checked when it was journaled, and the position of
    /// a step it completed is not built again: the step's [`Entry::CheckpointStored`] follows.
    pub(super) fn replay_report(
        &mut self,
        step: u64,
        rank: u32,
        world_size: u32,
        epoch: u32,
        positions: RankPositions,
    ) -> Result<()> {
        let report = RankReported {
            step,
            rank,
            world_size,
            epoch,
            positions,
            problem: None,
        };
        decide(&mut self.checkpoints, report).map(drop)
    }

    /// Storing the checkpoint of `step` that [`Master::commit_checkpoint`] made ready failed: a
    /// rank that reports the step again completes it again.
    pub fn checkpoint_store_failed(&mut self, step: u64) {
        decide(&mut self.checkpoints, StoreFailed { step });
    }

    /// Records that the checkpoint of `step` was stored under `token`, and forgets the oldest
    /// stored checkpoints past `checkpoint.keep`. Returns the tokens forgotten, whose objects the
    /// caller deletes once the entry is durable.
    pub fn checkpoint_stored(&mut self, step: u64, token: String) -> Applied<Vec<String>> {
        let keep = self
            .spec
            .checkpoint
            .as_ref()
            .and_then(|checkpoint| checkpoint.keep);
        let event = Stored {
            step,
            token: token.clone(),
            keep,
        };
        let forgotten = decide(&mut self.checkpoints, event);
        Applied {
            reply: forgotten,
            entries: vec![Entry::CheckpointStored { step, token }],
        }
    }

    /// Resets the task table to a stored data checkpoint and restarts the trainers from there
    /// (see "Restoring a data checkpoint" in the module's documentation). A restore to the
    /// checkpoint the job already stands at, with no row consumed since, changes nothing; one to
    /// another checkpoint then is refused. With the `rank` asking, a restore to that checkpoint
    /// from a rank that had not asked for it yet changes nothing either, whatever was consumed
    /// since: the ranks of trainers that no AM launched each ask, and the first to ask may have
    /// read on before the last does.
    pub fn restore(
        &mut self,
        token: String,
        position: DataPosition,
        now_ms: u64,
        rank: Option<u32>,
    ) -> Result<Applied<Restored>> {
        let mut reply = Restored {
            step: self.checkpoints.step_of(&token).unwrap_or(0),
            epoch: position.epoch,
            effect: self.restore_effect(),
            forgotten: Vec::new(),
        };
        let event = RestoreAsked {
            token: token.clone(),
            rows_consumed: self.rows_consumed_total(),
            rank,
        };
        match decide(&mut self.checkpoints, event)? {
            RestoreAction::AlreadyThere => {
                if self.rescale.is_none() {
                    reply.effect = RestoreEffect::AlreadyThere;
                }
                Ok(Applied {
                    reply,
                    entries: Vec::new(),
                })
            }
            RestoreAction::Reset => {
                reply.forgotten =
                    self.apply_restore(token.clone(), position.clone(), now_ms, None)?;
                tracing::info!(%token, step = reply.step, "job reset to a data checkpoint: the trainers restart");
                Ok(Applied {
                    reply,
                    entries: vec![Entry::Restored {
                        token,
                        position,
                        now_ms,
                    }],
                })
            }
        }
    }

    /// Resets the task table to a stored data checkpoint as the AM starts (`--resume-from`), with
    /// the roles' sizes of the spec it was started with: a job resumed with another
    /// `roles[].num` launches its trainers at the new sizes, and the rows not consumed at the
    /// checkpoint reach them exactly once. With the job's sizes, it is [`Master::restore`].
    pub fn resume_from(
        &mut self,
        token: String,
        position: DataPosition,
        now_ms: u64,
    ) -> Result<Applied<Restored>> {
        let role_sizes: Vec<u32> = self.spec.roles.iter().map(|role| role.num).collect();
        if role_sizes == self.role_sizes {
            return self.restore(token, position, now_ms, None);
        }
        let mut reply = Restored {
            step: self.checkpoints.step_of(&token).unwrap_or(0),
            epoch: position.epoch,
            effect: self.restore_effect(),
            forgotten: Vec::new(),
        };
        reply.forgotten = self.apply_restore(
            token.clone(),
            position.clone(),
            now_ms,
            Some(role_sizes.clone()),
        )?;
        tracing::info!(%token, step = reply.step, ?role_sizes, "job reset to a data checkpoint at the spec's role sizes");
        Ok(Applied {
            reply,
            entries: vec![Entry::ResumedFrom {
                token,
                position,
                now_ms,
                role_sizes,
            }],
        })
    }

    /// What a restore that changes the job does beside the task table.
    pub(super) fn restore_effect(&self) -> RestoreEffect {
        if self.executors.is_some() {
            RestoreEffect::TrainersRestart
        } else {
            RestoreEffect::RingsReplaced
        }
    }

    /// Resets the task table to `position`, restarts the trainers (at `role_sizes`, when given)
    /// and takes the rings back.
    pub(super) fn apply_restore(
        &mut self,
        token: String,
        position: DataPosition,
        now_ms: u64,
        role_sizes: Option<Vec<u32>>,
    ) -> Result<Vec<String>> {
        self.latest_ms = self.latest_ms.max(now_ms);
        self.reset_to(position, now_ms)?;
        // The rings the nodes hold are ranked over the sizes they were opened for.
        let previous_sizes = self.rescale.as_ref().map_or_else(
            || self.role_sizes.clone(),
            |rescale| rescale.previous_sizes.clone(),
        );
        let resized = role_sizes.filter(|sizes| *sizes != self.role_sizes);
        if let Some(sizes) = &resized {
            self.role_sizes.clone_from(sizes);
        }
        let trainers = self.trainer_ids();
        if let Some(executors) = &mut self.executors {
            if resized.is_some() {
                executors.replace_trainers(trainers.iter().cloned());
            } else {
                executors.restart_trainers();
            }
            self.restore_relaunch = Some(RestoreRelaunch {
                token: token.clone(),
                pending: trainers.into_iter().collect(),
            });
        }
        self.take_rings_back(previous_sizes, true);
        let floor = ConsumedFloor::new(
            self.table.epoch(),
            self.table.first_task_id(),
            self.table
                .task_spans()
                .map(|(span, done)| (done, span.start)),
            |slot| self.origins.origin(&self.table, slot),
        );
        let event = ResetTo {
            token,
            rows_consumed: self.rows_consumed_total(),
            floor,
        };
        Ok(decide(&mut self.checkpoints, event))
    }

    /// Resets the task table to `position`. The executors that ended for good are launched again,
    /// since the job runs again from there: a finished job's daemons and trainers run the rows
    /// after the checkpoint.
    pub(super) fn reset_to(&mut self, mut position: DataPosition, now_ms: u64) -> Result<()> {
        let mut pieces = self.pieces_of(&position);
        // Ids past the position's tasks name the tasks of splits added after it, not pieces.
        let covered = position.first_task_id + position.tasks.len() as u64;
        pieces.retain(|task, _| task.0 < covered);
        // Following is where the sources stand, not where the trainers do: it is kept. So are the
        // nodes, where the cluster stands: a node that registered after the checkpoint's step still
        // runs, holds rings of the trainers being restarted, and must give them back.
        position.following = self.table.following();
        position.nodes = self
            .table
            .nodes()
            .map(|(node, view)| NodeRecord {
                node,
                status: view.status,
                failures: view.failures,
            })
            .collect();
        self.table = self.restored_table(position, RestoreMode::Requeue { now_ms })?;
        self.origins.pieces = pieces;
        let planned_splits = self.plan.splits.len() - self.added.splits.len();
        self.origins.place_added(&self.table, planned_splits);
        decide(&mut self.checkpoints, RanksChanged);
        self.stop_reason = None;
        self.last_task_failure = None;
        if let Some(executors) = &mut self.executors {
            executors.restart_ended();
        }
        Ok(())
    }

    /// The token of the data checkpoint the table was last reset to, when what it consumed is not
    /// known, as after a takeover from a snapshot: give it with [`Master::restored_position`].
    pub fn restored_position_missing(&self) -> Option<&str> {
        self.checkpoints.floor_missing()
    }

    /// Gives the stored position of the data checkpoint the table was last reset to
    /// ([`Master::restored_position_missing`]): the rows it consumed count in every later step of
    /// its epoch.
    pub fn restored_position(&mut self, position: &DataPosition) {
        // A position of an epoch the job has left counts in none of its steps.
        let current = position.epoch == self.table.epoch()
            && position.first_task_id == self.table.first_task_id();
        let tasks = position.tasks.iter().filter(|_| current);
        let floor = ConsumedFloor::new(
            position.epoch,
            position.first_task_id,
            tasks.map(|task| (task.status == TaskStatus::Done, task.start)),
            |slot| match self.table.task_span(slot) {
                Some(_) => self.origins.origin(&self.table, slot),
                None => 0,
            },
        );
        self.checkpoints.set_floor(floor);
    }

    /// The origins of the re-split pieces of a position over the same epoch's tasks, kept from the
    /// current table when it is in that epoch.
    pub(super) fn pieces_of(&self, position: &DataPosition) -> BTreeMap<TaskId, u64> {
        if position.epoch == self.table.epoch()
            && position.first_task_id == self.table.first_task_id()
        {
            self.origins.pieces.clone()
        } else {
            BTreeMap::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn report(step: u64, rank: u32, world_size: u32) -> RankReported {
        RankReported {
            step,
            rank,
            world_size,
            epoch: 0,
            positions: BTreeMap::from([(TaskId(u64::from(rank)), 1)]),
            problem: None,
        }
    }

    proptest! {
        /// A step completes on the report that brings its last missing rank, whatever the order and
        /// the repeats before it; its reports stay until it is stored, and a report after that is
        /// answered with the token.
        #[test]
        fn a_step_completes_when_every_rank_reported_and_stays_until_stored(
            world_size in 1u32..6,
            ranks in proptest::collection::vec(0u32..6, 1..24),
        ) {
            let mut sut = Checkpoints::default();
            let mut seen = std::collections::BTreeSet::new();
            let mut completed = false;
            for rank in ranks.into_iter().map(|rank| rank % world_size) {
                seen.insert(rank);
                let action = decide(&mut sut, report(7, rank, world_size)).expect("a valid report");
                if seen.len() == world_size as usize && completed {
                    prop_assert_eq!(action, ReportAction::Pending { reported: world_size, world_size }, "completed once, while it is stored");
                } else if seen.len() == world_size as usize {
                    completed = true;
                    prop_assert_eq!(action, ReportAction::Complete { epoch: 0 });
                    let reports = sut.reports(7).expect("the reports stay until stored");
                    prop_assert_eq!(reports.keys().copied().collect::<Vec<_>>(), (0..world_size).collect::<Vec<_>>());
                } else {
                    prop_assert_eq!(action, ReportAction::Pending { reported: seen.len() as u32, world_size });
                }
            }
            let forgotten = decide(&mut sut, Stored { step: 7, token: "t7".into(), keep: None });
            prop_assert!(forgotten.is_empty());
            prop_assert!(sut.reports(7).is_none());
            prop_assert_eq!(
                decide(&mut sut, report(7, 0, world_size)).expect("a late report"),
                ReportAction::AlreadyStored("t7".into())
            );
        }

        /// Stored checkpoints past `keep` are forgotten oldest step first, each once.
        #[test]
        fn stored_checkpoints_past_keep_are_forgotten_oldest_first(
            keep in 1u32..5,
            steps in proptest::collection::btree_set(0u64..100, 0..20),
            order in any::<u64>(),
        ) {
            let mut steps: Vec<u64> = steps.into_iter().collect();
            let len = steps.len().max(1);
            steps.rotate_left((order as usize) % len);
            let mut sut = Checkpoints::default();
            let mut forgotten = Vec::new();
            for step in &steps {
                forgotten.extend(decide(&mut sut, Stored { step: *step, token: format!("t{step}"), keep: Some(keep) }));
                prop_assert!(sut.stored.len() <= keep as usize);
                if let Some((oldest, _)) = sut.stored.first_key_value() {
                    let step_of = |token: &String| token[1..].parse::<u64>().expect("a step");
                    prop_assert!(forgotten.iter().all(|token| step_of(token) < *oldest), "only older steps are forgotten");
                }
            }
            let kept: std::collections::BTreeSet<u64> = sut.stored.keys().copied().collect();
            prop_assert_eq!(kept.len() + forgotten.len(), steps.len());
            let mut all: Vec<String> = forgotten.clone();
            all.extend(sut.stored.values().cloned());
            all.sort();
            all.dedup();
            prop_assert_eq!(all.len(), steps.len(), "every stored checkpoint is kept or forgotten, once");
        }
    }

    #[test]
    fn after_a_reset_a_step_stored_past_the_checkpoint_is_committed_anew() {
        let mut sut = Checkpoints::default();
        for step in [1, 2, 3] {
            decide(
                &mut sut,
                Stored {
                    step,
                    token: format!("t{step}"),
                    keep: None,
                },
            );
        }
        decide(
            &mut sut,
            ResetTo {
                token: "t2".into(),
                rows_consumed: 0,
                floor: ConsumedFloor::new(0, 0, std::iter::empty(), |_| 0),
            },
        );
        assert_eq!(
            decide(&mut sut, report(2, 0, 1)).expect("a report"),
            ReportAction::AlreadyStored("t2".into()),
            "the checkpoint reset to, and those before it, stay"
        );
        assert_eq!(
            decide(&mut sut, report(3, 0, 1)).expect("a report"),
            ReportAction::Complete { epoch: 0 },
            "step 3 of the run that left is forgotten"
        );
        decide(
            &mut sut,
            ResetTo {
                token: "from-another-run".into(),
                rows_consumed: 0,
                floor: ConsumedFloor::new(0, 0, std::iter::empty(), |_| 0),
            },
        );
        assert!(sut.stored.is_empty(), "{:?}", sut.stored);
    }

    #[test]
    fn a_refused_report_changes_nothing() {
        let mut sut = Checkpoints::default();
        decide(&mut sut, report(1, 0, 2)).expect("rank 0");
        let before = sut.clone();
        let mut bad = report(1, 1, 2);
        bad.problem = Some(AmError::InvalidRequest("outside its rows".into()));
        assert!(decide(&mut sut, bad).is_err());
        let disagreeing = report(1, 1, 3);
        let error = decide(&mut sut, disagreeing).expect_err("another world size");
        assert!(error.to_string().contains("world size 3"), "{error}");
        let outside = report(1, 2, 2);
        assert!(decide(&mut sut, outside).is_err(), "rank 2 of 2");
        assert_eq!(sut, before);
    }

    #[test]
    fn changed_ranks_drop_the_steps_still_reporting_but_not_the_stored_ones() {
        let mut sut = Checkpoints::default();
        decide(
            &mut sut,
            Stored {
                step: 1,
                token: "t1".into(),
                keep: None,
            },
        );
        decide(&mut sut, report(2, 0, 2)).expect("rank 0");
        decide(&mut sut, RanksChanged);
        assert!(sut.reports(2).is_none());
        assert_eq!(
            decide(&mut sut, report(2, 1, 2)).expect("rank 1"),
            ReportAction::Pending {
                reported: 1,
                world_size: 2
            },
            "the step starts over"
        );
        assert_eq!(sut.step_of("t1"), Some(1));
    }

    #[test]
    fn a_floor_holds_tasks_done_in_bits_and_tasks_in_progress_by_row() {
        // Slot 0 done, 1 untouched, 2 consumed to row 35 of [30, 40), 3..130 done but 70.
        let tasks = (0..130u32).map(|slot| match slot {
            0 => (true, 10),
            1 => (false, 10),
            2 => (false, 35),
            70 => (false, 0),
            _ => (true, 0),
        });
        let sut = ConsumedFloor::new(1, 100, tasks, |slot| {
            u64::from(slot) * 10 + 10 * u64::from(slot == 1)
        });
        assert_eq!(sut.row(0, 10), Some(10));
        assert_eq!(sut.row(1, 20), None, "a task at its origin was not touched");
        assert_eq!(sut.row(2, 40), Some(35));
        assert_eq!(sut.row(70, 710), None);
        assert_eq!(sut.row(129, 1300), Some(1300));
        assert_eq!(sut.row(130, 1310), None, "past the position's tasks");
        assert_eq!(
            sut.partial.len(),
            1,
            "only the task in progress takes a row"
        );
        assert_eq!(sut.done.len(), 3);
    }

    #[test]
    fn a_restore_to_where_the_job_stands_changes_nothing_and_one_elsewhere_then_is_refused() {
        let mut sut = Checkpoints::default();
        let asked = |token: &str, rows_consumed| RestoreAsked {
            token: token.into(),
            rows_consumed,
            rank: None,
        };
        assert_eq!(
            decide(&mut sut, asked("a", 0)).expect("a first restore"),
            RestoreAction::Reset
        );
        decide(&mut sut, report(3, 0, 2)).expect("rank 0");
        decide(
            &mut sut,
            ResetTo {
                token: "a".into(),
                rows_consumed: 40,
                floor: ConsumedFloor::new(0, 0, std::iter::empty(), |_| 0),
            },
        );
        assert!(
            sut.reports(3).is_none(),
            "a reset drops the steps reporting"
        );
        assert_eq!(
            decide(&mut sut, asked("a", 40)).expect("the same again"),
            RestoreAction::AlreadyThere
        );
        let error = decide(&mut sut, asked("b", 40)).expect_err("another checkpoint");
        assert!(
            error.to_string().contains("loaded different checkpoints"),
            "{error}"
        );
        assert_eq!(
            decide(&mut sut, asked("b", 41)).expect("after rows were consumed"),
            RestoreAction::Reset
        );
    }

    #[test]
    fn a_rank_asking_late_for_the_restore_the_job_stands_at_reads_on_and_one_asking_again_resets() {
        let mut sut = Checkpoints::default();
        let asked = |rows_consumed, rank| RestoreAsked {
            token: "a".into(),
            rows_consumed,
            rank: Some(rank),
        };
        let reset_to_a = |sut: &mut Checkpoints, rows_consumed| {
            decide(
                sut,
                ResetTo {
                    token: "a".into(),
                    rows_consumed,
                    floor: ConsumedFloor::new(0, 0, std::iter::empty(), |_| 0),
                },
            )
        };
        assert_eq!(
            decide(&mut sut, asked(0, 0)).expect("rank 0"),
            RestoreAction::Reset
        );
        reset_to_a(&mut sut, 10);
        // Rank 0 read on before rank 1 asked.
        assert_eq!(
            decide(&mut sut, asked(25, 1)).expect("rank 1, late"),
            RestoreAction::AlreadyThere
        );
        assert_eq!(
            decide(&mut sut, asked(30, 0)).expect("rank 0 again"),
            RestoreAction::Reset,
            "a rank that asked before started over"
        );
        reset_to_a(&mut sut, 30);
        assert_eq!(
            decide(&mut sut, asked(31, 1)).expect("rank 1 after the new reset"),
            RestoreAction::AlreadyThere
        );
    }
}

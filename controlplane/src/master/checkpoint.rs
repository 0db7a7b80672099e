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
use super::{Applied, Entry, Master, TaskOrigins};
use crate::decide::{
    DataPosition, JobState, NodeRecord, RestoreMode, TaskId, TaskRecord, TaskStatus,
};
use crate::error::{AmError, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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

/// Builds the data position of `epoch` at a step from the ranks' reports, over the tasks of the
/// current table. Every task not fully consumed is pending, tasks in progress at the step first.
pub fn position_at_step(
    table: &JobState,
    origins: &TaskOrigins,
    epoch: u32,
    ranks: &BTreeMap<u32, RankPositions>,
) -> Result<DataPosition> {
    let current = table.position();
    if current.epoch != epoch {
        return Err(AmError::FailedPrecondition(format!(
            "data checkpoint of epoch {epoch}: the job has moved on to epoch {}; commit a checkpoint at a later step",
            current.epoch
        )));
    }
    let mut consumed_to: BTreeMap<TaskId, u64> = BTreeMap::new();
    for positions in ranks.values() {
        for (task, end_row) in positions {
            let entry = consumed_to.entry(*task).or_insert(*end_row);
            *entry = (*entry).max(*end_row);
        }
    }
    let first = current.first_task_id;
    let task_count = current.tasks.len() as u64;
    if let Some((task, _)) = consumed_to
        .iter()
        .find(|(task, _)| task.0 < first || task.0 - first >= task_count)
    {
        return Err(AmError::InvalidRequest(format!(
            "data checkpoint: {task} is not a task of epoch {epoch}; report only the tasks of the current epoch"
        )));
    }

    let mut started = Vec::new();
    let mut tasks = Vec::with_capacity(current.tasks.len());
    let mut done_rows = 0u64;
    for (index, record) in current.tasks.iter().enumerate() {
        let task = TaskId(first + index as u64);
        let origin = origins.origin(table, index as u32);
        let end_row = consumed_to.get(&task).copied().unwrap_or(origin);
        if end_row < origin || end_row > record.end {
            return Err(AmError::InvalidRequest(format!(
                "data checkpoint: {task} is reported consumed up to row {end_row}, outside its rows [{origin}, {})",
                record.end
            )));
        }
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
        if let Some(token) = self.stored.get(&step) {
            return Ok(Applied {
                reply: CommitOutcome::Stored(token.clone()),
                entries: Vec::new(),
            });
        }
        let positions: RankPositions = positions.into_iter().collect();
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
    pub(super) fn record_rank(
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
        let position = position_at_step(&self.table, &self.origins, epoch, &pending.ranks)?;
        let digest = crc32c::crc32c(
            &serde_json::to_vec(&position).expect("a data position serializes to JSON"),
        );
        Ok(CommitOutcome::Ready(ReadyCheckpoint {
            step,
            token: format!("{}-step{step}-{digest:08x}", self.spec.name),
            position,
        }))
    }

    /// Records that the checkpoint of `step` was stored under `token`, and forgets the oldest
    /// stored checkpoints past `checkpoint.keep`. Returns the tokens forgotten, whose objects the
    /// caller deletes once the entry is durable.
    pub fn checkpoint_stored(&mut self, step: u64, token: String) -> Applied<Vec<String>> {
        self.checkpoints.remove(&step);
        self.stored.insert(step, token.clone());
        let keep = self
            .spec
            .checkpoint
            .as_ref()
            .and_then(|checkpoint| checkpoint.keep)
            .map_or(usize::MAX, |keep| keep as usize);
        let mut pruned = Vec::new();
        while self.stored.len() > keep {
            if let Some((_, oldest)) = self.stored.pop_first() {
                pruned.push(oldest);
            }
        }
        Applied {
            reply: pruned,
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
    ) -> Result<Applied<Restored>> {
        let step = self
            .stored
            .iter()
            .find(|(_, stored)| **stored == token)
            .map_or(0, |(step, _)| *step);
        let mut reply = Restored {
            step,
            epoch: position.epoch,
            effect: self.restore_effect(),
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
                reply.effect = RestoreEffect::AlreadyThere;
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
    pub(super) fn restore_effect(&self) -> RestoreEffect {
        if self.executors.is_some() {
            RestoreEffect::TrainersRestart
        } else {
            RestoreEffect::RingsReplaced
        }
    }

    /// Resets the task table to `position`, restarts the trainers and takes the rings back.
    pub(super) fn apply_restore(
        &mut self,
        token: String,
        position: DataPosition,
        now_ms: u64,
    ) -> Result<()> {
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

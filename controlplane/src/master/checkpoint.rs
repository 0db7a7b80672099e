//! Data checkpoints: the task table as it stood at a trainer step.
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

use super::TaskOrigins;
use crate::decide::{DataPosition, JobState, TaskId, TaskRecord, TaskStatus};
use crate::error::{AmError, Result};
use std::collections::BTreeMap;

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

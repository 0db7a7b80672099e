//! Conversions between the task table's types and the `sluice.v1` messages.

use crate::decide::{Assignment, NodeStatus, Refusal, TaskId, TaskProgress};
use crate::plan::{JobPlan, PlannedFile, PlannedSplit};
use crate::spec::{JobSpec, TransformSpec};
use sluice_proto::v1::{self, command, refusal};

/// A daemon's counts for one task, from the wire.
pub(super) fn progress(progress: &v1::TaskProgress) -> TaskProgress {
    TaskProgress {
        task: TaskId(progress.task_id),
        enqueued: progress.enqueued,
        consumed: progress.consumed,
    }
}

fn command(command: command::Command) -> v1::Command {
    v1::Command {
        command: Some(command),
    }
}

/// Run these tasks, with their splits.
pub(super) fn assign_command(plan: &JobPlan, tasks: &[Assignment]) -> v1::Command {
    let tasks = tasks
        .iter()
        .map(|assignment| {
            let planned = plan.splits[assignment.split as usize];
            v1::TaskAssignment {
                task_id: assignment.task.0,
                epoch: assignment.epoch,
                split_index: assignment.split,
                start: assignment.start,
                end: assignment.end,
                split: Some(split(&plan.files[planned.file as usize], planned)),
            }
        })
        .collect();
    command(command::Command::Assign(v1::AssignTasks { tasks }))
}

fn split(file: &PlannedFile, split: PlannedSplit) -> v1::Split {
    v1::Split {
        uri: file.uri.clone(),
        file_size: file.file_size,
        first_row: split.first_row,
        row_count: split.row_count,
        partition_values: file
            .partition_values
            .iter()
            .map(|(name, value)| v1::PartitionValue {
                name: name.clone(),
                value: value.clone(),
            })
            .collect(),
        delta: file.delta.as_ref().map(|delta| v1::DeltaSplitInfo {
            version: delta.version,
            deletion_vector: delta
                .deletion_vector
                .as_ref()
                .map(|vector| v1::DeletionVector {
                    storage_type: vector.storage_type.clone(),
                    path_or_inline_dv: vector.path_or_inline_dv.clone(),
                    offset: vector.offset,
                    size_in_bytes: vector.size_in_bytes,
                    cardinality: vector.cardinality,
                }),
        }),
        source_index: file.source,
    }
}

/// Deliver the task's rows only up to `row`.
pub(super) fn stop_command(task: TaskId, row: u64) -> v1::Command {
    command(command::Command::Stop(v1::StopTask {
        task_id: task.0,
        row,
    }))
}

/// Drop every task and the unread ring contents, then register again holding nothing.
pub(super) fn fence_command() -> v1::Command {
    command(command::Command::Fence(v1::Fence {}))
}

/// A role was scaled: give every task and ring back, then register again.
pub(super) fn release_command() -> v1::Command {
    command(command::Command::Release(v1::Release {}))
}

/// The job is over: stop.
pub(super) fn shutdown_command() -> v1::Command {
    command(command::Command::Shutdown(v1::Shutdown {}))
}

/// The request, or part of it, was not applied.
pub(super) fn refuse_command(reason: &Refusal) -> v1::Command {
    let (kind, message) = match reason {
        Refusal::UnknownNode => (
            refusal::Kind::UnknownNode(v1::UnknownNode {}),
            "the node never registered; register first".to_owned(),
        ),
        Refusal::Blacklisted => (
            refusal::Kind::Blacklisted(v1::Blacklisted {}),
            "the node failed too many tasks and is blacklisted for the rest of the job".to_owned(),
        ),
        Refusal::UnknownTask(task) => (
            refusal::Kind::UnknownTask(v1::UnknownTask { task_id: task.0 }),
            format!("{task} is not a task of the current epoch"),
        ),
        Refusal::NotHeld(task) => (
            refusal::Kind::NotHeld(v1::NotHeld { task_id: task.0 }),
            format!("{task} is not in flight on this node"),
        ),
        Refusal::CountOutOfRange {
            task,
            enqueued,
            consumed,
            rows,
        } => (
            refusal::Kind::CountOutOfRange(v1::CountOutOfRange {
                task_id: task.0,
                enqueued: *enqueued,
                consumed: *consumed,
                rows: *rows,
            }),
            format!(
                "{task}: enqueued {enqueued} and consumed {consumed} do not fit its {rows} rows"
            ),
        ),
        Refusal::NoStopRequested(task) => (
            refusal::Kind::NoStopRequested(v1::NoStopRequested { task_id: task.0 }),
            format!("{task}: no stop was requested"),
        ),
        Refusal::StopRowOutOfRange {
            task,
            stop_row,
            min,
            max,
        } => (
            refusal::Kind::StopRowOutOfRange(v1::StopRowOutOfRange {
                task_id: task.0,
                stop_row: *stop_row,
                min: *min,
                max: *max,
            }),
            format!("{task}: stop row {stop_row} is outside [{min}, {max}]"),
        ),
        Refusal::DoneBeforeEnd {
            task,
            consumed,
            rows,
        } => (
            refusal::Kind::DoneBeforeEnd(v1::DoneBeforeEnd {
                task_id: task.0,
                consumed: *consumed,
                rows: *rows,
            }),
            format!("{task}: reported done after {consumed} of its {rows} rows"),
        ),
    };
    command(command::Command::Refuse(v1::Refuse {
        reason: Some(v1::Refusal { kind: Some(kind) }),
        message,
    }))
}

/// What the job reads and how, for the daemons. A Delta source goes with the version `plan` read.
pub(super) fn job_data(spec: &JobSpec, plan: &JobPlan) -> v1::JobData {
    v1::JobData {
        sources: spec
            .data
            .sources
            .iter()
            .enumerate()
            .map(|(index, source)| v1::SourceData {
                version: plan
                    .versions
                    .get(index)
                    .copied()
                    .flatten()
                    .or(source.version),
                uri: source.uri.clone(),
                format: source.format.name().to_owned(),
                columns: source.columns.clone().unwrap_or_default(),
                filter: source.filter.clone(),
                storage_options: source
                    .storage_options
                    .iter()
                    .map(|(key, value)| (key.clone(), value.clone()))
                    .collect(),
            })
            .collect(),
        batch_size: spec.data.batch_size,
        shuffle_seed: spec.data.shuffle.seed,
        shuffle_window: spec.data.shuffle.window,
        epochs: spec.data.epochs,
        shuffle: spec.data.shuffle.enabled,
        transforms: spec.data.transforms.iter().map(transform).collect(),
        fixed_batch_size: spec.data.fixed_batch_size,
    }
}

/// One preprocessing step on the wire.
fn transform(spec: &TransformSpec) -> v1::Transform {
    use v1::transform::Kind;
    let kind = match spec {
        TransformSpec::Cast { column, to } => Kind::Cast(v1::CastTransform {
            column: column.clone(),
            to: to.clone(),
        }),
        TransformSpec::FillNull { column, value } => Kind::FillNull(v1::FillNullTransform {
            column: column.clone(),
            value: value.clone(),
        }),
        TransformSpec::Normalize { column, mean, std } => Kind::Normalize(v1::NormalizeTransform {
            column: column.clone(),
            mean: *mean,
            std: *std,
        }),
        TransformSpec::HashBucket {
            column,
            buckets,
            output,
        } => Kind::HashBucket(v1::HashBucketTransform {
            column: column.clone(),
            buckets: *buckets,
            output: output.clone(),
        }),
    };
    v1::Transform { kind: Some(kind) }
}

/// A node's standing on the wire.
pub(super) fn node_state(status: NodeStatus) -> v1::NodeState {
    match status {
        NodeStatus::Alive => v1::NodeState::Alive,
        NodeStatus::Lost => v1::NodeState::Lost,
        NodeStatus::Blacklisted => v1::NodeState::Blacklisted,
    }
}

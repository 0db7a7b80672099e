//! The `sluice.v1` messages and the master's own terms, one into the other: the service's edge.
//!
//! The master takes and answers the domain calls of [`crate::master::calls`]; the gRPC service and
//! the JSON API turn each request into one of those here, and each answer back into its reply.

use crate::decide::{Assignment, NodeId, NodeStatus, Refusal, ReportOutcome, TaskId, TaskProgress};
use crate::error::{AmError, Result};
use crate::master::calls::{
    EpochBatches, Heartbeat, JobPhase, NodeCommand, RankCommit, Registered, Registration,
    RestoreEffect, Restored, Scaled, TaskReport,
};
use crate::master::{AddedSource, BadRange, SourceAdded};
use crate::plan::{JobPlan, PlannedFile, PlannedSplit};
use crate::spec::{BadDataPolicy, EvenBatches, JobSpec, SourceSpec, TransformSpec};
use sluice_formats::{ObjectIdentity, SplitBytes};
use sluice_proto::v1::{self, command, refusal};
use std::collections::BTreeSet;

/// A daemon's counts for one task, from the wire.
fn progress(progress: &v1::TaskProgress) -> TaskProgress {
    TaskProgress {
        task: TaskId(progress.task_id),
        enqueued: progress.enqueued,
        consumed: progress.consumed,
    }
}

/// A registration, from the wire.
pub(crate) fn registration(request: v1::RegisterRequest) -> Registration {
    Registration {
        node: NodeId(request.node_id),
        job_id: request.job_id,
        hostname: request.hostname,
        held: request.held.iter().map(progress).collect(),
        by_host: request.node_by_host,
    }
}

/// The answer to a registration: the master's, with what the job reads and how.
pub(crate) fn register_reply(
    spec: &JobSpec,
    plan: &JobPlan,
    registered: Registered,
) -> v1::RegisterReply {
    v1::RegisterReply {
        job_id: spec.name.clone(),
        heartbeat_interval_ms: spec.failover.heartbeat_interval_ms,
        // A daemon that registers learns every source from `data`.
        commands: commands(plan, &[], registered.commands),
        data: Some(job_data(spec, plan)),
        ranks: registered.ranks,
        world_size: registered.world_size,
        attach: registered.attach,
        lease_ms: spec.failover.lease_ms(),
        checkpoint_uri: spec
            .checkpoint
            .as_ref()
            .map(|checkpoint| checkpoint.uri.clone())
            .unwrap_or_default(),
        node_id: registered.node.0,
        current_epoch: registered.current_epoch,
    }
}

/// A heartbeat, from the wire.
pub(crate) fn heartbeat(request: v1::HeartbeatRequest) -> Heartbeat {
    Heartbeat {
        node: NodeId(request.node_id),
        progress: request.progress.iter().map(progress).collect(),
        stages: request.stages,
        ring_batches: request
            .rings
            .iter()
            .map(|ring| {
                ring.epoch_batches
                    .iter()
                    .map(|counted| EpochBatches {
                        epoch: counted.epoch,
                        batches: counted.batches,
                    })
                    .collect()
            })
            .collect(),
        rings: request.rings,
        tuning: request.tuning,
        hostname: request.hostname,
        keeps_finished_until_durable: request.keeps_finished_until_durable,
        handed: request
            .progress
            .iter()
            .map(|progress| (TaskId(progress.task_id), progress.sent))
            .collect(),
        dropped: request
            .progress
            .iter()
            .flat_map(|progress| {
                let task = TaskId(progress.task_id);
                progress
                    .dropped
                    .iter()
                    .map(move |span| (task, (span.first_row, span.row_count)))
            })
            .collect(),
        bad: request
            .progress
            .into_iter()
            .flat_map(|progress| {
                let task = TaskId(progress.task_id);
                progress.bad.into_iter().map(move |range| {
                    (
                        task,
                        BadRange {
                            uri: range.uri,
                            row_group: range.row_group,
                            first_row: range.first_row,
                            row_count: range.row_count,
                            cause: range.cause,
                        },
                    )
                })
            })
            .collect(),
    }
}

/// How far the AM's journal is written, for the wire.
pub(crate) fn journal_mark(mark: crate::journal::Mark) -> v1::JournalMark {
    v1::JournalMark {
        generation: mark.generation,
        appended: mark.appended,
        durable: mark.durable,
    }
}

/// The end of a task, from the wire; refused when it names no outcome.
pub(crate) fn task_report(request: v1::ReportTaskRequest) -> Result<TaskReport> {
    let outcome = match request.outcome {
        Some(v1::report_task_request::Outcome::Done(_)) => ReportOutcome::Done,
        Some(v1::report_task_request::Outcome::Failed(failed)) => ReportOutcome::Failed {
            reason: failed.reason,
        },
        None => {
            return Err(AmError::InvalidRequest(format!(
                "report of task-{} by node-{} has no outcome; set `done` or `failed`",
                request.task_id, request.node_id
            )));
        }
    };
    Ok(TaskReport {
        node: NodeId(request.node_id),
        task: TaskId(request.task_id),
        consumed: request.consumed,
        outcome,
    })
}

/// One rank's data position, from the wire.
pub(crate) fn rank_commit(request: v1::CommitDataCheckpointRequest) -> RankCommit {
    RankCommit {
        step: request.step,
        rank: request.rank,
        world_size: request.world_size,
        epoch: request.epoch,
        positions: request
            .positions
            .iter()
            .map(|position| (TaskId(position.task_id), position.end_row))
            .collect(),
    }
}

/// The answer to a restore.
pub(crate) fn restore_reply(restored: Restored) -> v1::RestoreDataCheckpointReply {
    let effect = match restored.effect {
        RestoreEffect::AlreadyThere => v1::RestoreEffect::AlreadyThere,
        RestoreEffect::TrainersRestart => v1::RestoreEffect::TrainersRestart,
        RestoreEffect::RingsReplaced => v1::RestoreEffect::RingsReplaced,
    };
    v1::RestoreDataCheckpointReply {
        step: restored.step,
        epoch: restored.epoch,
        effect: effect as i32,
    }
}

/// The answer to a scale.
pub(crate) fn scale_reply(scaled: Scaled) -> v1::ScaleRoleReply {
    v1::ScaleRoleReply {
        previous_num: scaled.previous_num,
        num: scaled.num,
    }
}

impl From<JobPhase> for v1::JobState {
    fn from(phase: JobPhase) -> v1::JobState {
        match phase {
            JobPhase::Starting => v1::JobState::Starting,
            JobPhase::Running => v1::JobState::Running,
            JobPhase::Stopping => v1::JobState::Stopping,
            JobPhase::Succeeded => v1::JobState::Succeeded,
            JobPhase::Failed => v1::JobState::Failed,
            JobPhase::Stopped => v1::JobState::Stopped,
        }
    }
}

/// The master's commands on the wire; an assignment takes its splits from `plan`, and the sources
/// of its tasks that were added to the running job from `added`.
pub(crate) fn commands(
    plan: &JobPlan,
    added: &[AddedSource],
    commands: Vec<NodeCommand>,
) -> Vec<v1::Command> {
    commands
        .into_iter()
        .map(|node_command| {
            let command = match node_command {
                NodeCommand::Assign(tasks) => assign(plan, added, &tasks),
                NodeCommand::Stop { task, row } => command::Command::Stop(v1::StopTask {
                    task_id: task.0,
                    row,
                }),
                NodeCommand::Fence => command::Command::Fence(v1::Fence {}),
                NodeCommand::Release => command::Command::Release(v1::Release {}),
                NodeCommand::Shutdown => command::Command::Shutdown(v1::Shutdown {}),
                NodeCommand::Refuse(reason) => refuse(&reason),
                NodeCommand::Settled {
                    current,
                    epochs,
                    allowed,
                } => {
                    let counts = |counts: Vec<(u32, u64)>| {
                        counts
                            .into_iter()
                            .map(|(epoch, batches)| v1::EpochBatches { epoch, batches })
                            .collect()
                    };
                    command::Command::Settled(v1::SettledBatches {
                        epochs: counts(epochs),
                        current_epoch: current,
                        allowed: counts(allowed),
                    })
                }
            };
            v1::Command {
                command: Some(command),
            }
        })
        .collect()
}

/// Run these tasks, with their splits and the added sources they read.
fn assign(plan: &JobPlan, added: &[AddedSource], tasks: &[Assignment]) -> command::Command {
    let read: BTreeSet<u32> = tasks
        .iter()
        .map(|assignment| {
            let planned = plan.splits[assignment.split as usize];
            plan.files[planned.file as usize].source
        })
        .collect();
    let sources = added
        .iter()
        .filter(|source| read.contains(&source.index))
        .map(|source| v1::AddedSource {
            index: source.index,
            data: Some(source_data(&source.spec, source.journaled.version)),
        })
        .collect();
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
                split: Some(split(
                    &plan.files[planned.file as usize],
                    planned,
                    plan.bytes_of(assignment.split),
                    plan.identity_of(planned.file),
                )),
            }
        })
        .collect();
    command::Command::Assign(v1::AssignTasks { tasks, sources })
}

fn split(
    file: &PlannedFile,
    split: PlannedSplit,
    bytes: Option<SplitBytes>,
    identity: Option<&ObjectIdentity>,
) -> v1::Split {
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
        bytes: bytes.map(|bytes| v1::SplitBytes {
            start: bytes.start,
            end: bytes.end,
            first_row: bytes.first_row,
            rows: bytes.rows,
            crc32c: bytes.crc32c,
        }),
        identity: identity.map(|identity| v1::ObjectIdentity {
            e_tag: identity.e_tag.clone(),
            version: identity.version.clone(),
            modified_ns: identity.modified_ns,
        }),
    }
}

/// The request, or part of it, was not applied.
fn refuse(reason: &Refusal) -> command::Command {
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
    command::Command::Refuse(v1::Refuse {
        reason: Some(v1::Refusal { kind: Some(kind) }),
        message,
    })
}

/// What the job reads and how, for the daemons. A Delta source goes with the version `plan` read.
pub(crate) fn job_data(spec: &JobSpec, plan: &JobPlan) -> v1::JobData {
    v1::JobData {
        sources: spec
            .data
            .sources
            .iter()
            .enumerate()
            .map(|(index, source)| source_data(source, plan.versions.get(index).copied().flatten()))
            .collect(),
        batch_size: spec.data.batch_size,
        shuffle_seed: spec.data.shuffle.seed,
        shuffle_window: spec.data.shuffle.window,
        epochs: spec.data.epochs,
        shuffle: spec.data.shuffle.enabled,
        transforms: spec.data.transforms.iter().map(transform).collect(),
        fixed_batch_size: spec.data.fixed_batch_size,
        cache: spec.data.cache.as_ref().map(|cache| v1::CacheData {
            dir: cache.dir.clone(),
            max_bytes: cache.max_bytes,
        }),
        on_bad_data: match spec.data.bad_data.policy {
            BadDataPolicy::Fail => v1::BadDataPolicy::Fail,
            BadDataPolicy::Skip => v1::BadDataPolicy::Skip,
            BadDataPolicy::Warn => v1::BadDataPolicy::Warn,
        }
        .into(),
        even_batches: match spec.data.even_batches {
            EvenBatches::Off => v1::EvenBatches::Off,
            EvenBatches::Pad => v1::EvenBatches::Pad,
            EvenBatches::Drop => v1::EvenBatches::Drop,
        }
        .into(),
        max_threads: spec.daemon.max_threads.unwrap_or(0),
        max_read_ahead_bytes: spec.daemon.max_read_ahead_bytes.unwrap_or(0),
    }
}

/// One source on the wire; a Delta table at the version it was planned at, if any.
fn source_data(source: &SourceSpec, planned_version: Option<u64>) -> v1::SourceData {
    v1::SourceData {
        version: planned_version.or(source.version),
        uri: source.uri.clone(),
        format: source.format.name().to_owned(),
        columns: source.columns.clone().unwrap_or_default(),
        filter: source.filter.clone(),
        storage_options: source
            .storage_options
            .iter()
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect(),
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

/// What an added source brought, on the wire.
pub(crate) fn source_added(added: SourceAdded) -> v1::AddSourceReply {
    v1::AddSourceReply {
        index: added.index,
        files: added.files,
        splits: added.splits,
        rows: added.rows,
        epoch: added.epoch,
    }
}

/// A node's standing on the wire.
pub(crate) fn node_state(status: NodeStatus) -> v1::NodeState {
    match status {
        NodeStatus::Alive => v1::NodeState::Alive,
        NodeStatus::Lost => v1::NodeState::Lost,
        NodeStatus::Blacklisted => v1::NodeState::Blacklisted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_without_an_outcome_is_refused_naming_the_task_and_the_fix() {
        let error = task_report(v1::ReportTaskRequest {
            node_id: 1,
            task_id: 7,
            consumed: 3,
            outcome: None,
        })
        .expect_err("no outcome");
        let message = error.to_string();
        assert!(message.contains("task-7 by node-1"), "{message}");
        assert!(message.contains("set `done` or `failed`"), "{message}");
    }

    #[test]
    fn every_command_keeps_its_fields_on_the_wire() {
        let mut plan = JobPlan::default();
        plan.extend(
            0,
            vec![sluice_formats::Split {
                task_id: 0,
                uri: "file:///data/part-0.csv".into(),
                file_size: 100,
                first_row: 40,
                row_count: 60,
                partition_values: Vec::new(),
                delta: None,
                bytes: Some(SplitBytes {
                    start: 20,
                    end: 90,
                    first_row: 40,
                    rows: 60,
                    crc32c: Some(0xabcd),
                }),
                identity: Some(ObjectIdentity {
                    e_tag: Some("\"1f-64\"".into()),
                    version: Some("v7".into()),
                    modified_ns: Some(1_764_245_847_000_000_001),
                }),
            }],
        );
        let assignment = Assignment {
            task: TaskId(3),
            epoch: 1,
            split: 0,
            start: 10,
            end: 20,
        };
        let sent = commands(
            &plan,
            &[],
            vec![
                NodeCommand::Assign(vec![assignment]),
                NodeCommand::Stop {
                    task: TaskId(3),
                    row: 15,
                },
                NodeCommand::Release,
                NodeCommand::Refuse(Refusal::NotHeld(TaskId(4))),
            ],
        );
        let kinds: Vec<_> = sent.into_iter().filter_map(|sent| sent.command).collect();
        let [
            command::Command::Assign(assign),
            command::Command::Stop(stop),
            command::Command::Release(_),
            command::Command::Refuse(refuse),
        ] = kinds.as_slice()
        else {
            panic!("the commands in their order: {kinds:?}");
        };
        let task = &assign.tasks[0];
        assert_eq!(
            (task.task_id, task.epoch, task.start, task.end),
            (3, 1, 10, 20)
        );
        let split = task.split.as_ref().expect("the split goes with the task");
        assert_eq!((split.first_row, split.row_count), (40, 60));
        let bytes = split.bytes.expect("the split's bytes go with it");
        assert_eq!(
            (
                bytes.start,
                bytes.end,
                bytes.first_row,
                bytes.rows,
                bytes.crc32c
            ),
            (20, 90, 40, 60, Some(0xabcd))
        );
        assert_eq!(
            split.identity,
            Some(v1::ObjectIdentity {
                e_tag: Some("\"1f-64\"".into()),
                version: Some("v7".into()),
                modified_ns: Some(1_764_245_847_000_000_001),
            }),
            "the file's identity goes with it"
        );
        assert_eq!((stop.task_id, stop.row), (3, 15));
        assert!(refuse.message.contains("task-4"), "{}", refuse.message);
    }
}

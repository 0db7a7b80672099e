//! What the master shows of the job: the status that `sluice status`, the status page and the
//! progress line read, and the task table's view. Reads only.
//!
//! The status is built as the `sluice.v1` status reply itself: it is a projection of the master's
//! state made for the wire and nothing else reads it, so a domain copy would only repeat the
//! message field by field (see [`super::calls`]).

use super::{Master, bad_data};
use crate::launcher::{ExecutorId, ExecutorState, Executors};
use crate::spec::LauncherKind;
use crate::wire;
use sluice_proto::v1;

impl Master {
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
                    state: wire::node_state(view.status) as i32,
                    since_last_heartbeat_ms: now_ms.saturating_sub(info.last_heard_ms),
                    tasks_held: view.tasks_held,
                    task_failures: view.failures,
                    stages: info.stages,
                    rings: info.rings,
                    tuning: info.tuning,
                }
            })
            .collect();
        let failure_reason = self.failure_reason();
        v1::StatusReply {
            job_id: self.spec.name.clone(),
            state: v1::JobState::from(self.phase()) as i32,
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
            waiting: self.waiting(),
            hangs: self.hangs(now_ms),
            bad_data: self
                .plan
                .left_out
                .iter()
                .take(bad_data::LISTED)
                .map(|file| v1::BadData {
                    epoch: 0,
                    uri: file.uri.clone(),
                    row_group: None,
                    rows: 0,
                    cause: file.cause.clone(),
                })
                .chain(self.bad_data.recent().map(|(key, range)| v1::BadData {
                    epoch: key.epoch,
                    uri: range.uri.clone(),
                    row_group: range.row_group,
                    rows: range.row_count,
                    cause: range.cause.clone(),
                }))
                .collect(),
            bad_rows: self.bad_data.rows(),
            bad_ranges: (self.plan.left_out.len() + self.bad_data.len()) as u64,
            dropped: self
                .dropped
                .recent()
                .map(|(key, rows)| {
                    let split = self.plan.splits.get(key.split as usize);
                    v1::DroppedRows {
                        epoch: key.epoch,
                        uri: split
                            .and_then(|split| self.plan.files.get(split.file as usize))
                            .map(|file| file.uri.clone())
                            .unwrap_or_default(),
                        split_first_row: split.map_or(0, |split| split.first_row),
                        first_row: key.first_row,
                        row_count: *rows,
                    }
                })
                .collect(),
            dropped_rows: self.dropped.rows(),
        }
    }

    /// What hangs at `now_ms`, by the spec's `failover.hang` bound: the trainers that have not read
    /// their rings (as of their daemons' last heartbeats) and the daemons that have not called,
    /// on the nodes alive. A daemon hangs only while the bound is shorter than the heartbeat
    /// timeout, after which its node is lost.
    pub fn hangs(&self, now_ms: u64) -> Vec<v1::Hang> {
        let policy = &self.spec.failover.hang;
        let action = policy.action.name();
        let daemon_bound_ms = policy.bound_ms(self.spec.failover.heartbeat_interval_ms);
        let task_bound_ms = policy.bound_ms(0);
        let mut hangs = Vec::new();
        let alive = self
            .table
            .nodes()
            .filter(|(_, view)| view.status == crate::decide::NodeStatus::Alive)
            .filter_map(|(node, _)| self.nodes.get(&node).map(|info| (node, info)));
        for (node, info) in alive {
            let silent_ms = now_ms.saturating_sub(info.last_heard_ms);
            if silent_ms >= daemon_bound_ms {
                hangs.push(v1::Hang {
                    node_id: node.0,
                    rank: 0,
                    stuck_ms: silent_ms,
                    bound_ms: daemon_bound_ms,
                    action: action.to_owned(),
                    kind: "daemon".to_owned(),
                    task_id: 0,
                });
            }
            for ring in &info.rings {
                let bound_ms = policy.bound_ms(ring.reader_interval_ms);
                if ring.reader_idle_ms > 0 && ring.reader_idle_ms >= bound_ms {
                    hangs.push(v1::Hang {
                        node_id: node.0,
                        rank: ring.rank,
                        stuck_ms: ring.reader_idle_ms,
                        bound_ms,
                        action: action.to_owned(),
                        kind: "trainer".to_owned(),
                        task_id: 0,
                    });
                }
                if ring.source_wait_ms >= task_bound_ms {
                    hangs.push(v1::Hang {
                        node_id: node.0,
                        rank: ring.rank,
                        stuck_ms: ring.source_wait_ms,
                        bound_ms: task_bound_ms,
                        action: action.to_owned(),
                        kind: "task".to_owned(),
                        task_id: ring.source_task_id,
                    });
                }
            }
        }
        hangs
    }

    /// What the job waits for, when it cannot run yet: daemons that have not registered, or,
    /// under the external launcher, trainers that have no ring yet. A job whose AM launches its
    /// executors says nothing: they come as it launches them.
    pub fn waiting(&self) -> Option<String> {
        if self.executors.is_some() || self.outcome().is_some() {
            return None;
        }
        let nodes = self.spec.nodes as usize;
        let registered = self.nodes.len();
        if registered < nodes {
            return Some(format!(
                "{registered} of {nodes} node daemons have registered; start one on each node with `sluice daemon --am <this AM's address>` (each serves the node of its host's name; `--node-id N`, N from 0 to {}, names the node instead)",
                nodes - 1
            ));
        }
        if self.spec.launcher != LauncherKind::External {
            return None;
        }
        let world = self.world_size() as usize;
        let rings: usize = self.nodes.values().map(|info| info.rings.len()).sum();
        (rings < world).then(|| {
            format!(
                "{rings} of {world} trainers have their rings; start them with torchrun or srun (or SLUICE_RANK and SLUICE_WORLD_SIZE) and SLUICE_AM=<this AM's address>, on the nodes of the daemons"
            )
        })
    }

    pub(super) fn source_statuses(&self) -> Vec<v1::SourceStatus> {
        self.spec
            .data
            .sources
            .iter()
            .enumerate()
            .map(|(index, source)| {
                let follow = self.follows.source(index as u32);
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
                    polls: self.follows.polls(index as u32),
                }
            })
            .collect()
    }

    pub(super) fn role_statuses(&self) -> Vec<v1::RoleStatus> {
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

    pub(super) fn trainer_statuses(&self) -> Vec<v1::TrainerStatus> {
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

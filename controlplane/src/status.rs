//! The job's status in the shapes people read: names of states, and the JSON object of `sluice
//! status --json` and the AM's JSON API.

use sluice_proto::v1;

/// The lowercase name of a job state, as `sluice status` prints it.
pub fn state_name(state: v1::JobState) -> &'static str {
    match state {
        v1::JobState::Unspecified => "unknown",
        v1::JobState::Starting => "starting",
        v1::JobState::Running => "running",
        v1::JobState::Stopping => "stopping",
        v1::JobState::Succeeded => "succeeded",
        v1::JobState::Failed => "failed",
        v1::JobState::Stopped => "stopped",
    }
}

/// The lowercase name of a node state.
pub fn node_state_name(state: i32) -> &'static str {
    match v1::NodeState::try_from(state) {
        Ok(v1::NodeState::Alive) => "alive",
        Ok(v1::NodeState::Lost) => "lost",
        Ok(v1::NodeState::Blacklisted) => "blacklisted",
        _ => "unknown",
    }
}

/// The status as one JSON object, the shape of `sluice status --json` and the AM's JSON API.
pub fn status_json(reply: &v1::StatusReply) -> serde_json::Value {
    let tasks = reply.tasks.unwrap_or_default();
    let state = v1::JobState::try_from(reply.state).unwrap_or(v1::JobState::Unspecified);
    serde_json::json!({
        "job": reply.job_id,
        "state": state_name(state),
        "failure_reason": reply.failure_reason,
        "epoch": reply.epoch,
        "epochs": reply.epochs,
        "rows_per_second": reply.rows_per_second,
        "scaling": reply.scaling,
        "waiting": reply.waiting,
        "tasks": {
            "pending": tasks.pending,
            "in_flight": tasks.in_flight,
            "done": tasks.done,
            "failed": tasks.failed,
            "rows_total": tasks.rows_total,
            "rows_consumed": tasks.rows_consumed,
            "rows_failed": tasks.rows_failed,
        },
        "roles": reply.roles.iter().map(|role| serde_json::json!({
            "name": role.name,
            "num": role.num,
            "running": role.running,
            "succeeded": role.succeeded,
            "failures": role.failures,
        })).collect::<Vec<_>>(),
        "nodes": reply.nodes.iter().map(|node| serde_json::json!({
            "node_id": node.node_id,
            "hostname": node.hostname,
            "state": node_state_name(node.state),
            "since_last_heartbeat_ms": node.since_last_heartbeat_ms,
            "tasks_held": node.tasks_held,
            "task_failures": node.task_failures,
            "stages": node.stages.iter().map(|stage| serde_json::json!({
                "stage": stage.stage,
                "busy_ns": stage.busy_ns,
                "wait_ns": stage.wait_ns,
                "rows": stage.rows,
                "bytes": stage.bytes,
            })).collect::<Vec<_>>(),
            "rings": node.rings.iter().map(|ring| serde_json::json!({
                "rank": ring.rank,
                "used_bytes": ring.used_bytes,
                "capacity_bytes": ring.capacity_bytes,
                "trainer_wait_ns": ring.trainer_wait_ns,
                "daemon_wait_ns": ring.daemon_wait_ns,
                "reader_idle_ms": ring.reader_idle_ms,
                "reader_interval_ms": ring.reader_interval_ms,
            })).collect::<Vec<_>>(),
            "tuning": node.tuning.as_ref().map(|tuning| serde_json::json!({
                "threads": tuning.threads,
                "max_threads": tuning.max_threads,
                "read_ahead_bytes": tuning.read_ahead_bytes,
                "max_read_ahead_bytes": tuning.max_read_ahead_bytes,
                "held_bytes": tuning.held_bytes,
            })),
        })).collect::<Vec<_>>(),
        "hangs": reply.hangs.iter().map(|hang| serde_json::json!({
            "node_id": hang.node_id,
            "rank": hang.rank,
            "stuck_ms": hang.stuck_ms,
            "bound_ms": hang.bound_ms,
            "action": hang.action,
            "kind": hang.kind,
            "task_id": hang.task_id,
        })).collect::<Vec<_>>(),
        "sources": reply.sources.iter().map(|source| serde_json::json!({
            "uri": source.uri,
            "followed": source.followed,
            "following": source.following,
            "planned_version": source.planned_version,
            "planned_files": source.planned_files,
            "follow_ended": source.follow_ended,
            "polls": source.polls,
        })).collect::<Vec<_>>(),
        "bad_data": reply.bad_data.iter().map(|bad| serde_json::json!({
            "epoch": bad.epoch,
            "uri": bad.uri,
            "row_group": bad.row_group,
            "rows": bad.rows,
            "cause": bad.cause,
        })).collect::<Vec<_>>(),
        "bad_rows": reply.bad_rows,
        "dropped": reply.dropped.iter().map(|dropped| serde_json::json!({
            "epoch": dropped.epoch,
            "uri": dropped.uri,
            "split_first_row": dropped.split_first_row,
            "first_row": dropped.first_row,
            "row_count": dropped.row_count,
        })).collect::<Vec<_>>(),
        "dropped_rows": reply.dropped_rows,
    })
}

/// The current epoch's task table as the JSON API shows it: the tasks in flight with their
/// progress, and how many tasks are in each state.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TaskTable {
    /// The current epoch, from 0.
    pub epoch: u32,
    /// Tasks of the epoch in each state.
    pub counts: TaskStateCounts,
    /// The tasks held by daemons, in task order.
    pub in_flight: Vec<InFlightTask>,
}

/// Tasks of an epoch in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TaskStateCounts {
    /// Waiting in the queue.
    pub pending: u64,
    /// Held by a daemon.
    pub in_flight: u64,
    /// Every row consumed.
    pub done: u64,
    /// Failed for good.
    pub failed: u64,
}

/// One task held by a daemon, with its progress.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct InFlightTask {
    /// The task.
    pub task_id: u64,
    /// The daemon that holds it.
    pub node_id: u64,
    /// The file its rows come from.
    pub uri: String,
    /// The first row of the task's current assignment, counted from the start of the file.
    pub first_row: u64,
    /// Rows in the current assignment.
    pub rows: u64,
    /// Rows the daemon wrote into its rings.
    pub enqueued: u64,
    /// Rows the trainers consumed.
    pub consumed: u64,
}

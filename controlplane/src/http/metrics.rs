//! The job's status as the OpenMetrics text exposition that Prometheus scrapes.
//!
//! Every scrape encodes a fresh registry from one status snapshot: the values are the AM's view at
//! that moment, not counters the AM keeps. Stage and ring figures are what each daemon last
//! reported, counted since that daemon started, so they are counters that reset when a daemon
//! restarts, which Prometheus' `rate()` expects.

use crate::status::state_name;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sluice_proto::v1;
use std::sync::atomic::AtomicU64;

/// Every job state, so that the state set lists each with 0 or 1.
const JOB_STATES: [v1::JobState; 7] = [
    v1::JobState::Unspecified,
    v1::JobState::Starting,
    v1::JobState::Running,
    v1::JobState::Stopping,
    v1::JobState::Succeeded,
    v1::JobState::Failed,
    v1::JobState::Stopped,
];

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct NodeHostLabels {
    node: u64,
    hostname: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct NodeLabel {
    node: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StageLabels {
    node: u64,
    stage: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RingLabels {
    node: u64,
    rank: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TuningLabels {
    node: u64,
    kind: &'static str,
}

type GaugeU64 = Gauge<u64, AtomicU64>;
type GaugeF64 = Gauge<f64, AtomicU64>;
type CounterF64 = Counter<f64, AtomicU64>;

const NANOS_PER_SECOND: f64 = 1e9;

/// The status as an OpenMetrics text exposition, metric names prefixed `sluice_am_`.
pub(super) fn exposition(status: &v1::StatusReply) -> String {
    let mut registry = Registry::with_prefix("sluice_am");
    register_job(&mut registry, status);
    register_nodes(&mut registry, &status.nodes);
    register_hangs(&mut registry, &status.hangs);
    let mut text = String::new();
    encode(&mut text, &registry).expect("encoding into a String cannot fail");
    text
}

/// A gauge holding `value`.
fn gauge<N, A: prometheus_client::metrics::gauge::Atomic<N> + Default>(value: N) -> Gauge<N, A> {
    let metric = Gauge::<N, A>::default();
    metric.set(value);
    metric
}

fn register_job(registry: &mut Registry, status: &v1::StatusReply) {
    let current = v1::JobState::try_from(status.state).unwrap_or(v1::JobState::Unspecified);
    let job_state = Family::<StateLabel, GaugeU64>::default();
    for state in JOB_STATES {
        job_state
            .get_or_create(&StateLabel {
                state: state_name(state),
            })
            .set(u64::from(state == current));
    }
    registry.register(
        "job_state",
        "The job's state: 1 for the state it is in, 0 for the others",
        job_state,
    );
    registry.register(
        "epoch",
        "The current epoch, counted from 0",
        gauge::<u64, AtomicU64>(u64::from(status.epoch)),
    );
    registry.register(
        "epochs",
        "The number of epochs the job runs",
        gauge::<u64, AtomicU64>(u64::from(status.epochs)),
    );
    let tasks = status.tasks.unwrap_or_default();
    registry.register(
        "epoch_rows",
        "Rows in one epoch",
        gauge::<u64, AtomicU64>(tasks.rows_total),
    );
    registry.register(
        "epoch_rows_consumed",
        "Rows of the current epoch consumed by trainers",
        gauge::<u64, AtomicU64>(tasks.rows_consumed),
    );
    registry.register(
        "epoch_rows_failed",
        "Rows of the current epoch in tasks that failed for good",
        gauge::<u64, AtomicU64>(tasks.rows_failed),
    );
    registry.register(
        "rows_per_second",
        "Rows consumed per second, averaged over the last few ticks of the AM",
        gauge::<f64, AtomicU64>(status.rows_per_second),
    );
    let bad_rows = Counter::<u64, AtomicU64>::default();
    bad_rows.inc_by(status.bad_rows);
    registry.register(
        "bad_data_rows",
        "Rows skipped because they did not decode (data.on_bad_data), in every epoch",
        bad_rows,
    );
    let bad_skips = Counter::<u64, AtomicU64>::default();
    bad_skips.inc_by(status.bad_ranges);
    registry.register(
        "bad_data_skips",
        "Skips of rows that did not decode (data.on_bad_data), in every epoch; the job's status names each",
        bad_skips,
    );
    let dropped_rows = Counter::<u64, AtomicU64>::default();
    dropped_rows.inc_by(status.dropped_rows);
    registry.register(
        "even_batches_dropped_rows",
        "Rows the rings left out of their epoch to keep their batch counts equal (data.even_batches: drop), in every epoch",
        dropped_rows,
    );
    let task_states = Family::<StateLabel, GaugeU64>::default();
    for (state, count) in [
        ("pending", tasks.pending),
        ("in_flight", tasks.in_flight),
        ("done", tasks.done),
        ("failed", tasks.failed),
    ] {
        task_states.get_or_create(&StateLabel { state }).set(count);
    }
    registry.register(
        "tasks",
        "Tasks of the current epoch in each state",
        task_states,
    );
}

fn register_hangs(registry: &mut Registry, hangs: &[v1::Hang]) {
    let trainers = Family::<RingLabels, GaugeF64>::default();
    let daemons = Family::<NodeLabel, GaugeF64>::default();
    let tasks = Family::<RingLabels, GaugeF64>::default();
    for hang in hangs {
        let seconds = hang.stuck_ms as f64 / 1000.0;
        let ring = RingLabels {
            node: hang.node_id,
            rank: hang.rank,
        };
        match hang.kind.as_str() {
            "daemon" => {
                daemons
                    .get_or_create(&NodeLabel { node: hang.node_id })
                    .set(seconds);
            }
            "task" => {
                tasks.get_or_create(&ring).set(seconds);
            }
            _ => {
                trainers.get_or_create(&ring).set(seconds);
            }
        }
    }
    registry.register(
        "trainer_hang_seconds",
        "Seconds a hung trainer (past the spec's failover.hang bound) has held its ring unread, as of its daemon's last heartbeat; only hung trainers are listed",
        trainers,
    );
    registry.register(
        "daemon_hang_seconds",
        "Seconds a hung node daemon (past the spec's failover.hang bound, not yet declared lost) has not called the AM; only hung daemons are listed",
        daemons,
    );
    registry.register(
        "task_hang_seconds",
        "Seconds a ring's feeder has waited for the next batch of a task from its source, past the spec's failover.hang.after_s, in a live daemon; only rings whose task hangs are listed",
        tasks,
    );
}

fn register_nodes(registry: &mut Registry, nodes: &[v1::NodeStatus]) {
    let up = Family::<NodeHostLabels, GaugeU64>::default();
    let since_heartbeat = Family::<NodeLabel, GaugeF64>::default();
    let tasks_held = Family::<NodeLabel, GaugeU64>::default();
    let stage_busy = Family::<StageLabels, CounterF64>::default();
    let stage_wait = Family::<StageLabels, CounterF64>::default();
    let stage_rows = Family::<StageLabels, Counter>::default();
    let stage_bytes = Family::<StageLabels, Counter>::default();
    let ring_used = Family::<RingLabels, GaugeU64>::default();
    let ring_capacity = Family::<RingLabels, GaugeU64>::default();
    let ring_trainer_wait = Family::<RingLabels, CounterF64>::default();
    let ring_daemon_wait = Family::<RingLabels, CounterF64>::default();
    let decode_threads = Family::<TuningLabels, GaugeU64>::default();
    let read_ahead = Family::<TuningLabels, GaugeU64>::default();
    for node in nodes {
        let alive = node.state == v1::NodeState::Alive as i32;
        up.get_or_create(&NodeHostLabels {
            node: node.node_id,
            hostname: node.hostname.clone(),
        })
        .set(u64::from(alive));
        let node_label = NodeLabel { node: node.node_id };
        since_heartbeat
            .get_or_create(&node_label)
            .set(node.since_last_heartbeat_ms as f64 / 1000.0);
        tasks_held
            .get_or_create(&node_label)
            .set(u64::from(node.tasks_held));
        for stage in &node.stages {
            let labels = StageLabels {
                node: node.node_id,
                stage: stage.stage.clone(),
            };
            stage_busy
                .get_or_create(&labels)
                .inc_by(stage.busy_ns as f64 / NANOS_PER_SECOND);
            stage_wait
                .get_or_create(&labels)
                .inc_by(stage.wait_ns as f64 / NANOS_PER_SECOND);
            stage_rows.get_or_create(&labels).inc_by(stage.rows);
            stage_bytes.get_or_create(&labels).inc_by(stage.bytes);
        }
        for ring in &node.rings {
            let labels = RingLabels {
                node: node.node_id,
                rank: ring.rank,
            };
            ring_used.get_or_create(&labels).set(ring.used_bytes);
            ring_capacity
                .get_or_create(&labels)
                .set(ring.capacity_bytes);
            ring_trainer_wait
                .get_or_create(&labels)
                .inc_by(ring.trainer_wait_ns as f64 / NANOS_PER_SECOND);
            ring_daemon_wait
                .get_or_create(&labels)
                .inc_by(ring.daemon_wait_ns as f64 / NANOS_PER_SECOND);
        }
        if let Some(tuning) = &node.tuning {
            let labels = |kind| TuningLabels {
                node: node.node_id,
                kind,
            };
            decode_threads
                .get_or_create(&labels("tuned"))
                .set(u64::from(tuning.threads));
            decode_threads
                .get_or_create(&labels("max"))
                .set(u64::from(tuning.max_threads));
            read_ahead
                .get_or_create(&labels("tuned"))
                .set(tuning.read_ahead_bytes);
            read_ahead
                .get_or_create(&labels("held"))
                .set(tuning.held_bytes);
            read_ahead
                .get_or_create(&labels("max"))
                .set(tuning.max_read_ahead_bytes);
        }
    }
    registry.register(
        "node_up",
        "1 while the node daemon is alive, 0 once it is lost or blacklisted",
        up,
    );
    registry.register(
        "node_since_heartbeat_seconds",
        "Seconds since the AM last heard from the node daemon",
        since_heartbeat,
    );
    registry.register("node_tasks_held", "Tasks the node daemon holds", tasks_held);
    registry.register(
        "stage_busy_seconds",
        "Seconds a pipeline stage of the node daemon spent working, since the daemon started",
        stage_busy,
    );
    registry.register(
        "stage_wait_seconds",
        "Seconds a pipeline stage of the node daemon spent waiting for input or for room downstream, since the daemon started",
        stage_wait,
    );
    registry.register(
        "stage_rows",
        "Rows that left a pipeline stage of the node daemon, since the daemon started",
        stage_rows,
    );
    registry.register(
        "stage_bytes",
        "Bytes that left a pipeline stage of the node daemon, since the daemon started",
        stage_bytes,
    );
    registry.register(
        "ring_used_bytes",
        "Bytes written into a trainer's ring and not yet released by the trainer",
        ring_used,
    );
    registry.register(
        "ring_capacity_bytes",
        "The capacity of a trainer's ring in bytes",
        ring_capacity,
    );
    registry.register(
        "ring_trainer_wait_seconds",
        "Seconds the trainer waited on its empty ring, since the daemon started",
        ring_trainer_wait,
    );
    registry.register(
        "ring_daemon_wait_seconds",
        "Seconds the node daemon waited on the trainer's full ring, since the daemon started",
        ring_daemon_wait,
    );
    registry.register(
        "node_decode_threads",
        "Tasks the node daemon reads and decodes at once, as it tuned them (kind tuned) and the most it may (kind max), as of its last heartbeat",
        decode_threads,
    );
    registry.register(
        "node_read_ahead_bytes",
        "Bytes of decoded batches the node daemon may hold ahead of its rings as it tuned them (kind tuned), holds (kind held) and may at most (kind max), as of its last heartbeat",
        read_ahead,
    );
}

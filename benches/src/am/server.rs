//! The AM under test: a job of a given number of tasks, planned synthetically and served through the
//! real [`AmServer`] path (journal, gRPC services, ticks).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use sluice_am::checkpoint_store::CheckpointStore;
use sluice_am::plan::{JobPlan, PlannedFile, PlannedSplit};
use sluice_am::server::{AmOptions, AmServer};
use sluice_am::spec::{Format, JobSpec};

use crate::error::{BenchError, Result};

/// The name of the benchmark's job, which daemons present when they register.
pub const JOB_NAME: &str = "bench-am";
/// Rows in every task: a daemon's counts grow over a few heartbeats before a task is done.
pub const ROWS_PER_TASK: u64 = 100;
/// The most splits the synthetic plan cuts the tasks into, as a dataset of that many files would.
const MAX_SPLITS: u64 = 1000;
/// The heartbeat interval the job asks of its daemons.
pub const HEARTBEAT_INTERVAL_MS: u64 = 1000;

/// The arguments of `sluice-bench am-server`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmServerArgs {
    /// Tasks in the job.
    pub tasks: u64,
    /// Node daemons in the job (`nodes` in its spec).
    pub executors: u32,
    /// The address to serve the gRPC API on.
    pub listen: SocketAddr,
    /// The directory of the job's journal (its `checkpoint.uri`); none keeps every change in memory.
    pub checkpoint: Option<PathBuf>,
    /// Seconds between the journal's snapshots (`checkpoint.interval_s`); none keeps the default.
    pub snapshot_interval_s: Option<u64>,
}

/// The job spec of the benchmark: `executors` nodes with one trainer each, one epoch of
/// [`ROWS_PER_TASK`]-row tasks, one-second heartbeats, and a journal under `checkpoint` with a
/// snapshot every `snapshot_interval_s` seconds (the AM's default when none).
pub fn synthetic_spec(
    executors: u32,
    checkpoint: Option<&std::path::Path>,
    snapshot_interval_s: Option<u64>,
) -> Result<JobSpec> {
    let interval = snapshot_interval_s
        .map(|seconds| format!(", interval_s: {seconds}"))
        .unwrap_or_default();
    let checkpoint = checkpoint
        .map(|directory| {
            format!(
                "checkpoint: {{ uri: \"file://{}\"{interval} }}\n",
                directory.display()
            )
        })
        .unwrap_or_default();
    let text = format!(
        r#"
name: {JOB_NAME}
data:
  sources: [{{ uri: "file:///sluice-bench/synthetic", format: parquet }}]
  task_rows: {ROWS_PER_TASK}
  epochs: 1
nodes: {executors}
roles:
  - {{ name: worker, num: {executors}, command: [sluice, consume] }}
failover: {{ heartbeat_interval_ms: {HEARTBEAT_INTERVAL_MS} }}
{checkpoint}"#
    );
    JobSpec::parse(&text, Format::Yaml).map_err(|source| BenchError::AmSetup {
        operation: "building the benchmark's job spec".to_owned(),
        reason: source.to_string(),
    })
}

/// A plan of exactly `tasks` tasks of [`ROWS_PER_TASK`] rows, spread evenly over up to
/// [`MAX_SPLITS`] synthetic files of one split each.
pub fn synthetic_plan(tasks: u64) -> JobPlan {
    let splits = tasks.clamp(1, MAX_SPLITS);
    let (per_split, remainder) = (tasks / splits, tasks % splits);
    let files = (0..splits)
        .map(|index| PlannedFile {
            source: 0,
            uri: format!("file:///sluice-bench/synthetic/part-{index:05}.parquet"),
            file_size: (per_split + 1) * ROWS_PER_TASK * 64,
            partition_values: Vec::new(),
            delta: None,
        })
        .collect();
    let splits = (0..splits)
        .map(|index| PlannedSplit {
            file: index as u32,
            first_row: 0,
            row_count: (per_split + u64::from(index < remainder)) * ROWS_PER_TASK,
        })
        .collect();
    JobPlan {
        files,
        splits,
        versions: vec![None],
        bytes: Vec::new(),
        identities: Vec::new(),
        left_out: Vec::new(),
    }
}

/// Serves the benchmark's job until it is over: prints `serving on ADDR` on stdout once the journal
/// is restored and the address bound, then answers daemons like any AM.
pub async fn serve_synthetic_am(args: &AmServerArgs) -> Result<()> {
    if args.tasks == 0 || args.executors == 0 {
        return Err(BenchError::InvalidAmArgs {
            reason: format!(
                "--tasks {} --executors {}: the job needs at least one task and one executor",
                args.tasks, args.executors
            ),
        });
    }
    let setup = |operation: &str| {
        let operation = operation.to_owned();
        move |error: sluice_am::AmError| BenchError::AmSetup {
            operation,
            reason: error.to_string(),
        }
    };
    let spec = Arc::new(synthetic_spec(
        args.executors,
        args.checkpoint.as_deref(),
        args.snapshot_interval_s,
    )?);
    let checkpoints = match &spec.checkpoint {
        Some(checkpoint) => CheckpointStore::at(&checkpoint.uri, &Default::default())
            .map_err(setup("opening the checkpoint location"))?,
        None => CheckpointStore::in_memory(),
    };
    let options = AmOptions {
        listen: args.listen,
        token: None,
        resume_from: None,
        launch: None,
        tls: None,
        insecure: false,
        advertise: None,
    };
    let server = AmServer::start_with_plan(spec, synthetic_plan(args.tasks), checkpoints, options)
        .await
        .map_err(setup("starting the AM"))?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "serving on {}", server.local_addr())
        .and_then(|()| stdout.flush())
        .map_err(|source| BenchError::AmIo {
            operation: "printing the AM's address".to_owned(),
            source,
        })?;
    drop(stdout);
    server.serve().await.map_err(setup("serving"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_synthetic_plan_has_exactly_the_tasks_asked_for() {
        for tasks in [1, 7, 999, 1000, 1001, 123_457] {
            let sut = synthetic_plan(tasks);
            let spec = synthetic_spec(3, None, None).expect("spec");
            let master =
                sluice_am::master::Master::new(Arc::new(spec), Arc::new(sut.clone())).expect("job");
            assert_eq!(master.table().task_count() as u64, tasks, "{tasks} tasks");
            assert!(sut.splits.len() as u64 <= MAX_SPLITS);
            assert_eq!(sut.files.len(), sut.splits.len());
        }
    }

    #[test]
    fn the_spec_journals_under_the_given_directory() {
        let directory = std::path::Path::new("/tmp/sluice-bench-journal");
        let sut = synthetic_spec(10_000, Some(directory), None).expect("spec");
        assert_eq!(sut.nodes, 10_000);
        let checkpoint = sut.checkpoint.expect("a checkpoint location");
        assert_eq!(checkpoint.uri, "file:///tmp/sluice-bench-journal");
        assert_eq!(checkpoint.interval_s, 300, "the AM's default");
        assert_eq!(sut.failover.heartbeat_interval_ms, HEARTBEAT_INTERVAL_MS);
        assert!(
            synthetic_spec(1, None, None)
                .expect("spec")
                .checkpoint
                .is_none()
        );
        let snapshotting = synthetic_spec(3, Some(directory), Some(2)).expect("spec");
        assert_eq!(
            snapshotting
                .checkpoint
                .expect("a checkpoint location")
                .interval_s,
            2
        );
    }
}

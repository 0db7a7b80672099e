//! The Sluice node daemon: it registers with the job's AM, pulls tasks, reads their rows through the
//! formats layer, and writes them as Arrow record batches into one ring per local trainer rank.
//!
//! # Implementation
//! Each rank's ring has a writer thread ([`writer`]) that owns the ring's producer, and a feeder
//! task that reads the tasks given to that ring one after the other and hands their batches to the
//! writer. A task feeds exactly one ring; new tasks go to the ring with the fewest tasks queued. The
//! main loop heartbeats, pulls tasks before the queues run dry, and applies the AM's commands.
//!
//! Positions are the task's order positions: split rows, in the split's delivery order when the
//! job shuffles ([`shuffle`]). The formats layer tells which positions each batch covers, rows a
//! filter or a deletion vector removed included, and a batch record carries exactly that range
//! ([`pipeline`]); the ranges of a task's batches tile it. A task's *enqueued* count is the end of
//! its last published batch, its *consumed* count the end of the last batch the trainer released
//! (the ring's read cursor passed it); the AM marks a task done once its consumed count reaches its
//! end.
//!
//! A stop request ("deliver up to row k") is acknowledged with the row where the feeder really
//! stops: `k`, or the end of what it had already handed to the writer if that is further. The
//! feeder cuts the batch that holds that row, so the rows before it go out and the rest do not.
//!
//! # Restarts
//! Everything the daemon reports comes from the rings and their ledgers in shared memory (see
//! [`writer`]): a task is bound to its ring's ledger before its first batch is written, the ledger's
//! consumed ends rise as the writer folds what the trainer released, and a task's slot is freed
//! only once the AM has acknowledged it finished. A daemon started again with the same node id,
//! job and ring directory, while its trainers live, takes over the rings its ledgers name, folds
//! and surveys them, and registers holding every task they list, with consumed = the ledger's
//! consumed end and enqueued = the end of the task's last record still in the ring. The AM gives
//! the tasks it kept back ([`v1::TaskAssignment`]s of tasks already bound to a ring), and each one
//! resumes after its enqueued rows: the batches still in the ring stay there, so the trainer sees no
//! gap and no repeat. Slots of tasks the AM did not give back are freed. A fenced daemon (the AM
//! declared it lost and queued its tasks again) empties its ledgers and registers holding nothing.
//!
//! # Scaling
//! When a role is scaled the AM stops every trainer, then sends `Release`: the daemon stops its
//! feeders and writers, surveys each ring a last time (the read cursors are final, since no
//! trainer reads them), reports its tasks' final counts in a heartbeat, removes its rings and
//! ledgers with the rows still unread, and registers again holding nothing; the AM queues the tasks
//! again from their consumed counts. The registration's answer names the ranks to open rings for
//! (none while other daemons still give theirs back; a later `Release` then brings them).

#![forbid(unsafe_code)]

#[cfg(test)]
mod feed_tests;
mod pipeline;
mod shuffle;
mod stats;
mod transform;
mod writer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_formats::{Dataset, Expr, OpenOptions, ReadOptions, SplitBatch};
use sluice_proto::BearerToken;
use sluice_proto::v1;
use sluice_proto::v1::command::Command as Cmd;
use sluice_proto::v1::daemon_service_client::DaemonServiceClient;
use sluice_ring::ledger::{EpochMark, LEDGER_EXTENSION, Ledger, LedgerTask};
use sluice_ring::{RING_EXTENSION, Ring, RingOptions};
use tokio::sync::mpsc;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use pipeline::{Shape, TaskFeed};
use shuffle::Interleave;
use stats::Stages;
use writer::{Attached, RingState, Write};

/// How often the daemon looks at its rings' read cursors between heartbeats.
const PROGRESS_POLL: Duration = Duration::from_millis(5);

/// How a daemon is run.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// The AM's gRPC address.
    pub am: String,
    /// This node's id in the job.
    pub node_id: u64,
    /// Rings are created under `<ring_dir>/<job>/<rank>.ring`.
    pub ring_dir: PathBuf,
    /// The size of each ring's data region.
    pub ring_size: u64,
    /// The AM's shared token.
    pub token: Option<String>,
    /// How long to keep trying to reach an AM that does not answer.
    pub am_timeout: Duration,
    /// Serve Prometheus `/metrics` (stages and rings) on this address.
    pub http: Option<std::net::SocketAddr>,
    /// The job the daemon was launched for. With it, a daemon started again finds the rings its
    /// node fed under `<ring_dir>/<job>` and takes them over; without it, it starts from nothing.
    pub job: Option<String>,
}

/// Why the daemon stopped.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The AM could not be reached for longer than the timeout.
    #[error(
        "no answer from the AM at {am} for {seconds} s: {reason}; check --am and that the AM runs"
    )]
    Unreachable {
        /// The address.
        am: String,
        /// How long the daemon tried.
        seconds: u64,
        /// The last error.
        reason: String,
    },
    /// The AM refused this daemon.
    #[error("the AM refused this daemon: {0}")]
    Refused(String),
    /// A ring could not be created or written.
    #[error("{0}")]
    Ring(String),
    /// The job's transforms cannot run on its sources' batches.
    #[error("the job's data.transforms: {0}")]
    Transform(String),
    /// The daemon's threads could not be started.
    #[error("{0}; check the process's thread limit (ulimit -u)")]
    Threads(String),
    /// The metrics endpoint could not be served.
    #[error("serving the daemon's metrics: {0}")]
    Metrics(String),
    /// A source of the job could not be opened.
    #[error("opening source {uri}: {source}")]
    Source {
        /// The source.
        uri: String,
        /// The formats layer's error.
        source: sluice_formats::FormatError,
    },
}

/// What the feeder and the main loop share about a task.
#[derive(Debug, Default)]
struct Control {
    /// The split row (exclusive) the feeder stops at, once a stop was asked for.
    stop: Option<u64>,
    /// The end of the rows handed to the writer.
    sent_end: u64,
    /// Why reading failed.
    failed: Option<String>,
}

/// A task this daemon holds.
#[derive(Debug)]
struct Held {
    start: u64,
    end: u64,
    ring: usize,
    control: Arc<Mutex<Control>>,
    enqueued_end: u64,
    consumed_end: u64,
}

/// A task on its way to a ring's feeder.
#[derive(Debug)]
struct Job {
    assignment: v1::TaskAssignment,
    control: Arc<Mutex<Control>>,
}

/// One source of the job, opened.
#[derive(Debug)]
struct Source {
    dataset: Dataset,
    options: ReadOptions,
    /// The schema of the batches the reader gives, before the transforms.
    schema: arrow::datatypes::SchemaRef,
}

/// The job's sources and how every task is shaped.
#[derive(Debug)]
struct Pipeline {
    sources: Vec<Source>,
    shape: Shape,
    /// The schema of the batches written to the rings: the first source's, after the transforms.
    schema: arrow::datatypes::SchemaRef,
    /// How busy the stages after fetch are.
    stages: Arc<Stages>,
    /// Where tasks are read and decoded.
    decode: tokio::runtime::Handle,
}

impl Pipeline {
    /// Every stage's figures so far, fetch included.
    fn stage_stats(&self) -> Vec<v1::StageStats> {
        let fetch_busy = self
            .sources
            .iter()
            .map(|source| source.dataset.fetch_stats().busy())
            .sum();
        let fetch_bytes = self
            .sources
            .iter()
            .map(|source| source.dataset.fetch_stats().bytes())
            .sum();
        self.stages.report(fetch_busy, fetch_bytes)
    }
}

/// One rank's ring: its feeder's queue, the writer's state and thread.
#[derive(Debug)]
struct RankRing {
    rank: u32,
    queue: mpsc::UnboundedSender<Job>,
    /// The writer's queue, for surveys.
    writer: mpsc::Sender<Write>,
    state: Arc<RingState>,
    /// The read cursor at the last survey sent to the writer.
    surveyed_read: u64,
    queued: usize,
    feeder: tokio::task::JoinHandle<()>,
    writer_thread: std::thread::JoinHandle<()>,
}

fn lock(control: &Mutex<Control>) -> std::sync::MutexGuard<'_, Control> {
    control
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs the daemon until the AM shuts it down.
pub async fn run(options: DaemonOptions) -> Result<(), DaemonError> {
    let client = connect(&options).await?;
    let job_id = options.job.clone().unwrap_or_default();
    let mut recovered = match &options.job {
        Some(job) => recover(&options.ring_dir.join(job), options.node_id)?,
        None => BTreeMap::new(),
    };
    let mut reply = register(&options, &client, &job_id, held_in(&recovered)?).await?;
    let fenced = reply
        .commands
        .iter()
        .any(|command| matches!(command.command, Some(Cmd::Fence(_))));
    if fenced && !recovered.is_empty() {
        // The AM declared this node lost and queued its tasks again from their last reported
        // counts: the rings keep the rows still in them, which the trainers will see twice.
        for attached in recovered.values() {
            let ledger = attached.state.ledger();
            tracing::warn!(ledger = %ledger.path().display(), tasks = ledger.tasks().map_or(0, |tasks| tasks.len()), "the AM fenced this node: its ledger is emptied");
            ledger.clear();
        }
        reply = register(&options, &client, &job_id, Vec::new()).await?;
    }
    let data = reply.data.clone().unwrap_or_default();
    // Tasks are read and decoded on a runtime of their own, so that the work never delays the
    // heartbeats, progress and commands of this one.
    let decode = DecodeRuntime::start()?;
    let pipeline = Arc::new(open_pipeline(&data, decode.handle()).await?);
    let job_dir = options.ring_dir.join(&reply.job_id);
    // Rings of an earlier run of the job that no process uses any more hold nothing anyone will
    // read; a ring a trainer still reads is kept and taken over, and so is one taken over above.
    let collected = sluice_ring::gc::collect(&job_dir).map_err(|error| {
        DaemonError::Ring(format!(
            "collecting dead rings in {}: {error}",
            job_dir.display()
        ))
    })?;
    for removed in &collected.removed {
        tracing::info!(ring = %removed.display(), "removed a dead ring of an earlier run");
    }
    std::fs::create_dir_all(&job_dir).map_err(|error| {
        DaemonError::Ring(format!(
            "creating ring directory {}: {error}; check --ring-dir",
            job_dir.display()
        ))
    })?;
    let served: ServedRings = Arc::default();
    let metrics = match options.http {
        Some(address) => {
            Some(serve_metrics(address, options.node_id, pipeline.clone(), served.clone()).await?)
        }
        None => None,
    };
    loop {
        let rings = open_rings(&options, &job_dir, &reply.ranks, &mut recovered, &pipeline)?;
        for (rank, attached) in std::mem::take(&mut recovered) {
            tracing::warn!(rank, ring = %attached.state.ledger().path().display(), "a ring this node fed is no longer one of its ranks: left as it is");
        }
        *lock_served(&served) = rings
            .iter()
            .map(|ring| (ring.rank, ring.state.clone()))
            .collect();
        tracing::info!(node = options.node_id, job = reply.job_id, ranks = ?reply.ranks, "daemon registered");
        let ended = serve(&options, &client, &pipeline, rings, reply).await;
        lock_served(&served).clear();
        match ended? {
            Ended::Shutdown => break,
            Ended::GaveBack => {
                reply = register(&options, &client, &job_id, Vec::new()).await?;
            }
        }
    }
    if let Some(metrics) = metrics {
        metrics.abort();
    }
    tracing::info!(node = options.node_id, "daemon shut down");
    Ok(())
}

/// The rings the metrics endpoint reports: those of the registration being served.
type ServedRings = Arc<Mutex<Vec<(u32, Arc<RingState>)>>>;

fn lock_served(served: &ServedRings) -> std::sync::MutexGuard<'_, Vec<(u32, Arc<RingState>)>> {
    served
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How serving one registration ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The AM shut the daemon down.
    Shutdown,
    /// A role was scaled: the daemon gave its tasks and rings back and registers again.
    GaveBack,
}

/// Opens the ring of every rank, taking over the ones `recovered` holds, and starts its writer and
/// feeder.
fn open_rings(
    options: &DaemonOptions,
    job_dir: &Path,
    ranks: &[u32],
    recovered: &mut BTreeMap<u32, Attached>,
    pipeline: &Arc<Pipeline>,
) -> Result<Vec<RankRing>, DaemonError> {
    let mut rings = Vec::new();
    for rank in ranks {
        let attached = match recovered.remove(rank) {
            Some(attached) => attached,
            None => {
                let (ring, ledger) = open_ring(job_dir, *rank, options.ring_size, options.node_id)?;
                writer::attach(ring, ledger).map_err(DaemonError::Ring)?
            }
        };
        let epoch = match attached.mark {
            EpochMark::Batch { epoch } => Some(epoch),
            EpochMark::Start | EpochMark::EndOfEpoch => None,
        };
        let started = writer::start(
            attached,
            pipeline.schema.clone(),
            *rank,
            pipeline.stages.clone(),
        )
        .map_err(DaemonError::Ring)?;
        let (queue, jobs) = mpsc::unbounded_channel();
        let feeder = tokio::spawn(feed(jobs, started.sender.clone(), pipeline.clone(), epoch));
        rings.push(RankRing {
            rank: *rank,
            queue,
            writer: started.sender,
            state: started.state,
            surveyed_read: 0,
            queued: 0,
            feeder,
            writer_thread: started.thread,
        });
    }
    Ok(rings)
}

/// Serves one registration: applies the AM's commands, pulls tasks, heartbeats, and reports, until
/// the AM shuts the daemon down or asks for its rings back.
async fn serve(
    options: &DaemonOptions,
    client: &AmClient,
    pipeline: &Pipeline,
    mut rings: Vec<RankRing>,
    reply: v1::RegisterReply,
) -> Result<Ended, DaemonError> {
    let interval = Duration::from_millis(reply.heartbeat_interval_ms.clamp(10, 10_000));
    let mut held: BTreeMap<u64, Held> = BTreeMap::new();
    let mut pending = reply.commands;
    let mut acks: Vec<(u64, u64)> = Vec::new();
    let mut registering = true;
    loop {
        let mut ended = None;
        for command in pending.drain(..) {
            match command.command {
                Some(Cmd::Assign(assign)) => {
                    for assignment in assign.tasks {
                        take_task(assignment, &mut rings, &mut held, options.node_id)?;
                    }
                }
                Some(Cmd::Stop(stop)) => {
                    if let Some(task) = held.get_mut(&stop.task_id) {
                        let mut control = lock(&task.control);
                        let at = stop.row.max(control.sent_end).min(task.end);
                        control.stop = Some(at);
                        task.end = at;
                        rings[task.ring].state.ledger().set_end(stop.task_id, at);
                        acks.push((stop.task_id, at));
                    }
                }
                Some(Cmd::Shutdown(_)) => ended = Some(Ended::Shutdown),
                Some(Cmd::Release(_)) => {
                    // The commands after it were meant for the rings given back.
                    ended = Some(Ended::GaveBack);
                    break;
                }
                Some(Cmd::Fence(_)) => {
                    return Err(DaemonError::Refused(
                        "the AM declared this daemon lost; start it again to rejoin the job"
                            .to_owned(),
                    ));
                }
                Some(Cmd::Refuse(refuse)) => {
                    tracing::warn!(message = refuse.message, "the AM refused part of a request")
                }
                Some(Cmd::Drain(_)) | None => {}
            }
        }
        match ended {
            Some(Ended::Shutdown) => {
                stop_rings(rings).await?;
                return Ok(Ended::Shutdown);
            }
            Some(Ended::GaveBack) => {
                give_back(options, client, pipeline, rings, &held).await?;
                return Ok(Ended::GaveBack);
            }
            None => {}
        }
        if registering {
            // The registration's answer gave back every task the AM kept on this node; the AM
            // has the others finished, or queued again, so their slots describe nothing.
            registering = false;
            free_unheld(&rings, &held);
        }
        for (task_id, stop_row) in acks.drain(..) {
            let reply = call(options, || {
                let mut client = client.clone();
                let request = v1::AckStopRequest {
                    node_id: options.node_id,
                    task_id,
                    stop_row,
                };
                async move { client.ack_stop(request).await }
            })
            .await?;
            pending.extend(reply.commands);
        }
        // At most one task per ring more than the ring interleaves (two without a shuffle) not
        // yet consumed: enough to keep every ring fed, few enough that nodes share the work.
        let wanted =
            ((pipeline.shape.window() + 1) * rings.len()).saturating_sub(held.len()) as u32;
        if wanted > 0 {
            let reply = call(options, || {
                let mut client = client.clone();
                let request = v1::AcquireTasksRequest {
                    node_id: options.node_id,
                    max_tasks: wanted,
                };
                async move { client.acquire_tasks(request).await }
            })
            .await?;
            pending.extend(reply.commands);
        }
        if !pending.is_empty() {
            continue;
        }
        // Heartbeat once per interval, or as soon as a task is consumed to its end or has failed,
        // so that the AM learns it at once and the daemon can pull the next task. A ring is
        // surveyed (its released records folded into the ledger) at the start of the interval
        // and whenever its trainer released more; a writer busy with a full queue surveys later,
        // and a full ring folds meanwhile.
        let waiting = std::time::Instant::now();
        let mut surveys_due = true;
        let progress = loop {
            for ring in rings.iter_mut() {
                let read = ring.state.read_cursor();
                if (surveys_due || read != ring.surveyed_read)
                    && ring.writer.try_send(Write::Survey).is_ok()
                {
                    ring.surveyed_read = read;
                }
            }
            surveys_due = false;
            tokio::time::sleep(PROGRESS_POLL.min(interval)).await;
            let progress = collect_progress(&mut held, &mut rings);
            let settled = held
                .values()
                .any(|task| task.consumed_end >= task.end || lock(&task.control).failed.is_some());
            if settled || waiting.elapsed() >= interval {
                break progress;
            }
        };
        let failed: Vec<(u64, String, u64)> = held
            .iter()
            .filter_map(|(task_id, task)| {
                let control = lock(&task.control);
                let reason = control.failed.clone()?;
                (task.consumed_end >= control.sent_end)
                    .then(|| (*task_id, reason, task.consumed_end - task.start))
            })
            .collect();
        let reply = call(options, || {
            let mut client = client.clone();
            let request = v1::HeartbeatRequest {
                node_id: options.node_id,
                progress: progress.clone(),
                stages: pipeline.stage_stats(),
                rings: ring_stats(rings.iter().map(|ring| (ring.rank, ring.state.as_ref()))),
            };
            async move { client.heartbeat(request).await }
        })
        .await?;
        pending.extend(reply.commands);
        // The AM has acknowledged these finished: their slots can go.
        let finished: Vec<u64> = held
            .iter()
            .filter(|(_, task)| task.consumed_end >= task.end)
            .map(|(task_id, _)| *task_id)
            .collect();
        for task_id in finished {
            release(&mut held, &rings, task_id);
        }
        for (task_id, reason, consumed) in failed {
            let reply = call(options, || {
                let mut client = client.clone();
                let request = v1::ReportTaskRequest {
                    node_id: options.node_id,
                    task_id,
                    consumed,
                    outcome: Some(v1::report_task_request::Outcome::Failed(v1::TaskFailed {
                        reason: reason.clone(),
                    })),
                };
                async move { client.report_task(request).await }
            })
            .await?;
            release(&mut held, &rings, task_id);
            pending.extend(reply.commands);
        }
        if let Some(failure) = rings.iter().find_map(|ring| ring.state.failure()) {
            return Err(DaemonError::Ring(failure));
        }
    }
}

/// Stops every ring's feeder and writer, which closes the ring; returns the rings' states.
async fn stop_rings(rings: Vec<RankRing>) -> Result<Vec<Arc<RingState>>, DaemonError> {
    let mut states = Vec::with_capacity(rings.len());
    for ring in rings {
        ring.feeder.abort();
        drop(ring.queue);
        drop(ring.writer);
        let _ = ring.feeder.await;
        let rank = ring.rank;
        tokio::task::spawn_blocking(move || ring.writer_thread.join())
            .await
            .map_err(|error| DaemonError::Ring(format!("rank {rank}: {error}")))?
            .map_err(|_| DaemonError::Ring(format!("the writer of rank {rank} panicked")))?;
        states.push(ring.state);
    }
    Ok(states)
}

/// Gives every task and ring back after a scale: the writers stop and survey their rings a last
/// time (no trainer reads them any more, so the read cursors are final), a heartbeat reports each
/// task's final counts, and the rings and their ledgers are removed with the rows still unread. The
/// AM queues the tasks again from their consumed counts when the daemon registers holding nothing.
async fn give_back(
    options: &DaemonOptions,
    client: &AmClient,
    pipeline: &Pipeline,
    rings: Vec<RankRing>,
    held: &BTreeMap<u64, Held>,
) -> Result<(), DaemonError> {
    for ring in &rings {
        ring.state.give_back();
    }
    let states = stop_rings(rings).await?;
    let progress: Vec<v1::TaskProgress> = held
        .iter()
        .map(|(task_id, task)| {
            let entry = states[task.ring].ledger().task(*task_id);
            let consumed_end = entry.map_or(task.consumed_end, |entry| {
                entry.consumed_end.max(task.consumed_end)
            });
            let enqueued_end = entry.map_or(task.enqueued_end, |entry| {
                entry.enqueued_end.max(task.enqueued_end)
            });
            v1::TaskProgress {
                task_id: *task_id,
                enqueued: enqueued_end.max(consumed_end) - task.start,
                consumed: consumed_end - task.start,
            }
        })
        .collect();
    let consumed: u64 = progress.iter().map(|task| task.consumed).sum();
    call(options, || {
        let mut client = client.clone();
        let request = v1::HeartbeatRequest {
            node_id: options.node_id,
            progress: progress.clone(),
            stages: pipeline.stage_stats(),
            rings: Vec::new(),
        };
        async move { client.heartbeat(request).await }
    })
    .await?;
    for state in states {
        for file in state.files() {
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    return Err(DaemonError::Ring(format!(
                        "removing {} to give the ring back: {error}",
                        file.display()
                    )));
                }
            }
        }
    }
    tracing::info!(
        node = options.node_id,
        tasks = held.len(),
        consumed,
        "gave every task and ring back"
    );
    Ok(())
}

/// Registers with the AM, holding `held`.
async fn register(
    options: &DaemonOptions,
    client: &AmClient,
    job_id: &str,
    held: Vec<v1::TaskProgress>,
) -> Result<v1::RegisterReply, DaemonError> {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_default();
    call(options, || {
        let mut client = client.clone();
        let request = v1::RegisterRequest {
            node_id: options.node_id,
            job_id: job_id.to_owned(),
            hostname: hostname.clone(),
            held: held.clone(),
        };
        async move { client.register(request).await }
    })
    .await
}

/// Takes over the rings under `job_dir` whose ledgers belong to `node`, by rank. A ring its producer
/// closed (the job ended) holds nothing to take over.
fn recover(job_dir: &Path, node: u64) -> Result<BTreeMap<u32, Attached>, DaemonError> {
    let mut recovered = BTreeMap::new();
    let entries = match std::fs::read_dir(job_dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(recovered),
        Err(error) => {
            return Err(DaemonError::Ring(format!(
                "listing ring directory {}: {error}",
                job_dir.display()
            )));
        }
    };
    for entry in entries {
        let path = entry
            .map_err(|error| DaemonError::Ring(format!("listing {}: {error}", job_dir.display())))?
            .path();
        let rank = path
            .file_stem()
            .and_then(|stem| stem.to_str())
            .and_then(|stem| stem.parse::<u32>().ok());
        let (Some(rank), Some(LEDGER_EXTENSION)) = (
            rank,
            path.extension().and_then(|extension| extension.to_str()),
        ) else {
            continue;
        };
        let ledger = Ledger::open(&path).map_err(|error| DaemonError::Ring(error.to_string()))?;
        let ring_path = path.with_extension(RING_EXTENSION);
        if ledger.owner() != node || !ring_path.exists() {
            continue;
        }
        let ring = Ring::open(&ring_path).map_err(|error| DaemonError::Ring(error.to_string()))?;
        if ring.is_closed() {
            continue;
        }
        let attached = writer::attach(ring, ledger).map_err(DaemonError::Ring)?;
        tracing::info!(
            rank,
            ring = %ring_path.display(),
            tasks = attached.state.ledger().tasks().map_or(0, |tasks| tasks.len()),
            "took over a ring this node fed before it restarted"
        );
        recovered.insert(rank, attached);
    }
    Ok(recovered)
}

/// The tasks the ledgers of the rings taken over hold, with their counts.
fn held_in(recovered: &BTreeMap<u32, Attached>) -> Result<Vec<v1::TaskProgress>, DaemonError> {
    let mut held = Vec::new();
    for attached in recovered.values() {
        let tasks = attached
            .state
            .ledger()
            .tasks()
            .map_err(|error| DaemonError::Ring(error.to_string()))?;
        held.extend(tasks.iter().map(|task| v1::TaskProgress {
            task_id: task.task_id,
            enqueued: task.enqueued_end - task.start,
            consumed: task.consumed_end - task.start,
        }));
    }
    Ok(held)
}

/// Takes an assigned task. A task already bound to one of the rings (the AM gives the tasks it kept
/// back after a restart) resumes there after its enqueued rows; a new one is bound to the ring with
/// the fewest tasks queued before any of its rows are read.
fn take_task(
    assignment: v1::TaskAssignment,
    rings: &mut [RankRing],
    held: &mut BTreeMap<u64, Held>,
    node: u64,
) -> Result<(), DaemonError> {
    let task_id = assignment.task_id;
    let bound = rings.iter().enumerate().find_map(|(index, ring)| {
        ring.state
            .ledger()
            .task(task_id)
            .map(|entry| (index, entry))
    });
    let (ring, entry) = match bound {
        Some((ring, entry)) => {
            if entry.start != assignment.start || entry.enqueued_end > assignment.end {
                return Err(DaemonError::Refused(format!(
                    "the AM gives back task {task_id} as rows {}..{}, but ring {} holds it from row {} with rows up to {} enqueued; the ring and the AM disagree",
                    assignment.start,
                    assignment.end,
                    rings[ring].rank,
                    entry.start,
                    entry.enqueued_end
                )));
            }
            rings[ring].state.ledger().set_end(task_id, assignment.end);
            (
                ring,
                LedgerTask {
                    end: assignment.end,
                    ..entry
                },
            )
        }
        None => {
            let ring = (0..rings.len())
                .min_by_key(|index| rings[*index].queued)
                .ok_or_else(|| {
                    DaemonError::Refused(format!(
                        "node {node} feeds no trainer rank; raise the roles' `num` or lower `nodes`"
                    ))
                })?;
            let entry = LedgerTask {
                task_id,
                epoch: assignment.epoch,
                start: assignment.start,
                end: assignment.end,
                consumed_end: assignment.start,
                enqueued_end: assignment.start,
            };
            rings[ring]
                .state
                .ledger()
                .bind(&entry)
                .map_err(|error| DaemonError::Ring(error.to_string()))?;
            (ring, entry)
        }
    };
    let control = Arc::new(Mutex::new(Control {
        sent_end: entry.enqueued_end,
        ..Control::default()
    }));
    held.insert(
        task_id,
        Held {
            start: entry.start,
            end: entry.end,
            ring,
            control: control.clone(),
            enqueued_end: entry.enqueued_end,
            consumed_end: entry.consumed_end,
        },
    );
    if entry.enqueued_end < entry.end {
        rings[ring].queued += 1;
        let _ = rings[ring].queue.send(Job {
            assignment: v1::TaskAssignment {
                start: entry.enqueued_end,
                ..assignment
            },
            control,
        });
    }
    Ok(())
}

/// Frees the ledger slot of every task bound to a ring that this daemon does not hold.
fn free_unheld(rings: &[RankRing], held: &BTreeMap<u64, Held>) {
    for ring in rings {
        let ledger = ring.state.ledger();
        let Ok(tasks) = ledger.tasks() else {
            continue;
        };
        for task in tasks {
            if !held.contains_key(&task.task_id) {
                if task.enqueued_end > task.consumed_end {
                    tracing::warn!(
                        task = task.task_id,
                        rows = task.enqueued_end - task.consumed_end,
                        "the AM did not give back a task with rows still in the ring: the trainer reads them anyway"
                    );
                }
                ledger.free(task.task_id);
            }
        }
    }
}

/// Drops a task the AM has acknowledged finished, with its ledger slot.
fn release(held: &mut BTreeMap<u64, Held>, rings: &[RankRing], task_id: u64) {
    if let Some(task) = held.remove(&task_id) {
        rings[task.ring].state.ledger().free(task_id);
    }
}

/// Turns what the ledgers say into per-task counts, relative to each task's start.
fn collect_progress(
    held: &mut BTreeMap<u64, Held>,
    rings: &mut [RankRing],
) -> Vec<v1::TaskProgress> {
    for (task_id, task) in held.iter_mut() {
        if let Some(entry) = rings[task.ring].state.ledger().task(*task_id) {
            task.consumed_end = task.consumed_end.max(entry.consumed_end);
            task.enqueued_end = task.enqueued_end.max(entry.enqueued_end);
        }
    }
    for ring in rings.iter_mut() {
        ring.queued = 0;
    }
    for task in held.values() {
        if task.consumed_end < task.end {
            rings[task.ring].queued += 1;
        }
    }
    held.iter()
        .map(|(task_id, task)| v1::TaskProgress {
            task_id: *task_id,
            enqueued: task.enqueued_end - task.start,
            consumed: task.consumed_end - task.start,
        })
        .collect()
}

fn ring_stats<'a>(rings: impl IntoIterator<Item = (u32, &'a RingState)>) -> Vec<v1::RingStats> {
    rings
        .into_iter()
        .map(|(rank, state)| {
            let (used, capacity) = state.occupancy();
            let (trainer_wait, daemon_wait) = state.waits();
            v1::RingStats {
                rank,
                used_bytes: used,
                capacity_bytes: capacity,
                trainer_wait_ns: u64::try_from(trainer_wait.as_nanos()).unwrap_or(u64::MAX),
                daemon_wait_ns: u64::try_from(daemon_wait.as_nanos()).unwrap_or(u64::MAX),
            }
        })
        .collect()
}

/// Serves `/metrics` on `address` for as long as the daemon runs; prints the address it got.
async fn serve_metrics(
    address: std::net::SocketAddr,
    node: u64,
    pipeline: Arc<Pipeline>,
    rings: ServedRings,
) -> Result<tokio::task::JoinHandle<()>, DaemonError> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|error| {
            DaemonError::Metrics(format!(
                "binding {address}: {error}; choose another --http address"
            ))
        })?;
    let bound = listener
        .local_addr()
        .map_err(|error| DaemonError::Metrics(error.to_string()))?;
    let metrics = move || {
        let rings = ring_stats(
            lock_served(&rings)
                .iter()
                .map(|(rank, state)| (*rank, state.as_ref())),
        );
        let text = stats::prometheus(node, &pipeline.stage_stats(), &rings);
        async move {
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    "text/plain; version=0.0.4",
                )],
                text,
            )
        }
    };
    let router = axum::Router::new().route("/metrics", axum::routing::get(metrics));
    println!("sluice daemon: node {node} metrics on http://{bound}/metrics");
    Ok(tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::warn!(%error, "the metrics server stopped");
        }
    }))
}

/// Reads the tasks given to one ring into its writer. Without a shuffle the tasks go one after the
/// other; with one, up to the shuffle window of them are open at once and each next batch comes
/// from one of them chosen by the epoch's seeded interleave. A task's batches keep their order, and
/// the tasks of an epoch all end before the end-of-epoch record. `epoch` is the epoch of the ring's
/// last batch when no end of epoch follows it (a daemon that took the ring over continues it): a
/// task of another epoch ends that one.
///
/// Every open task is read on a task of its own, ahead of the writer (see [`Pump`]), and one more
/// task of the epoch than the window is opened, so that reading and decoding the next task overlaps
/// the end of the current one, on another core.
async fn feed(
    mut jobs: mpsc::UnboundedReceiver<Job>,
    writer: mpsc::Sender<Write>,
    pipeline: Arc<Pipeline>,
    mut epoch: Option<u32>,
) {
    let window = pipeline.shape.window();
    let seed = pipeline.shape.shuffle.map_or(0, |shuffle| shuffle.seed);
    let mut interleave = Interleave::new(seed, epoch.unwrap_or(0));
    let mut open: Vec<(Job, Pump)> = Vec::new();
    let mut next_epoch: Option<Job> = None;
    loop {
        while open.len() <= window && next_epoch.is_none() {
            let job = if open.is_empty() {
                let idle = Instant::now();
                let job = jobs.recv().await;
                pipeline.stages.read.wait(idle.elapsed());
                match job {
                    Some(job) => job,
                    None => return,
                }
            } else {
                match jobs.try_recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            };
            let job_epoch = job.assignment.epoch;
            if epoch != Some(job_epoch) {
                if !open.is_empty() {
                    next_epoch = Some(job);
                    break;
                }
                if epoch.is_some() && writer.send(Write::EndOfEpoch).await.is_err() {
                    return;
                }
                epoch = Some(job_epoch);
                interleave = Interleave::new(seed, job_epoch);
            }
            let pump = Pump::start(job.assignment.clone(), pipeline.clone());
            open.push((job, pump));
        }
        if open.is_empty() {
            // Every task of the epoch ended: the next epoch's first task opens it.
            if let Some(job) = next_epoch.take() {
                if writer.send(Write::EndOfEpoch).await.is_err() {
                    return;
                }
                epoch = Some(job.assignment.epoch);
                interleave = Interleave::new(seed, job.assignment.epoch);
                let pump = Pump::start(job.assignment.clone(), pipeline.clone());
                open.push((job, pump));
            }
            continue;
        }
        let pick = interleave.pick(open.len().min(window));
        let (job, task) = &mut open[pick];
        match feed_task(
            &job.assignment,
            &job.control,
            task,
            &writer,
            &pipeline.stages,
        )
        .await
        {
            Ok(Fed::More) => {}
            Ok(Fed::Done) => {
                open.remove(pick);
            }
            Err(reason) => {
                fail(job, reason);
                open.remove(pick);
            }
        }
    }
}

/// The runtime tasks are read and decoded on: one worker per core, apart from the daemon's own.
/// Stopped without waiting when dropped, which may happen on the daemon's runtime.
struct DecodeRuntime(Option<tokio::runtime::Runtime>);

impl DecodeRuntime {
    fn start() -> Result<DecodeRuntime, DaemonError> {
        let cores = std::thread::available_parallelism().map_or(1, |cores| cores.get());
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cores)
            .thread_name("sluice-decode")
            .enable_all()
            .build()
            .map(|runtime| DecodeRuntime(Some(runtime)))
            .map_err(|error| DaemonError::Threads(format!("starting the decode threads: {error}")))
    }

    fn handle(&self) -> tokio::runtime::Handle {
        self.0
            .as_ref()
            .expect("the runtime lives until dropped")
            .handle()
            .clone()
    }
}

impl Drop for DecodeRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// How many batches a task's reader may hold ready ahead of the writer.
const READ_AHEAD_BATCHES: usize = 4;

/// A task read on a tokio task of its own: opened, read, permuted, transformed and batched ahead of
/// the writer, its batches waiting in a bounded queue. Dropped, it stops reading.
struct Pump {
    batches: mpsc::Receiver<Result<SplitBatch, String>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Pump {
    fn start(assignment: v1::TaskAssignment, pipeline: Arc<Pipeline>) -> Pump {
        let (sender, batches) = mpsc::channel(READ_AHEAD_BATCHES);
        let reader = pipeline.decode.clone().spawn(async move {
            // Opening reads the footer, and with a shuffle the whole split.
            let opening = Instant::now();
            let opened = open_task(&assignment, &pipeline).await;
            pipeline.stages.read.busy(opening.elapsed());
            let mut task = match opened {
                Ok(task) => task,
                Err(reason) => {
                    let _ = sender.send(Err(reason)).await;
                    return;
                }
            };
            loop {
                let next = task.next(assignment.end, &pipeline.stages).await;
                let last = !matches!(next, Ok(Some(_)));
                let Some(item) = next.transpose() else {
                    return;
                };
                if sender.send(item).await.is_err() || last {
                    return;
                }
            }
        });
        Pump { batches, reader }
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl std::fmt::Debug for Pump {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Pump").finish_non_exhaustive()
    }
}

/// Marks a task failed; the main loop reports it once its delivered rows are consumed.
fn fail(job: &Job, reason: String) {
    tracing::warn!(task = job.assignment.task_id, %reason, "task failed");
    lock(&job.control).failed = Some(reason);
}

/// Opens the reading of one task.
async fn open_task(
    assignment: &v1::TaskAssignment,
    pipeline: &Pipeline,
) -> Result<TaskFeed, String> {
    let split = assignment
        .split
        .as_ref()
        .ok_or_else(|| format!("task {} came without its split", assignment.task_id))?;
    let source = pipeline
        .sources
        .get(split.source_index as usize)
        .ok_or_else(|| {
            format!(
                "task {} names unknown source {}",
                assignment.task_id, split.source_index
            )
        })?;
    TaskFeed::open(assignment, source, &pipeline.shape).await
}

/// Whether a task has more to give after a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fed {
    More,
    Done,
}

/// Hands the next batch of one task to the writer, cut at the task's stop row.
///
/// Every batch covers the task rows from the end of the one before, rows the filter or a deletion
/// vector removed included, so the positions the writer records are exact: a stop at row k sends
/// exactly the rows before k, and the daemon that is given `[k, end)` reads exactly the rest.
async fn feed_task(
    assignment: &v1::TaskAssignment,
    control: &Mutex<Control>,
    task: &mut Pump,
    writer: &mpsc::Sender<Write>,
    stages: &Stages,
) -> Result<Fed, String> {
    let Some(covered) = task.batches.recv().await.transpose()? else {
        return Ok(Fed::Done);
    };
    let decided = {
        let mut control = lock(control);
        let limit = control.stop.unwrap_or(assignment.end);
        if covered.first_row >= limit {
            None
        } else {
            let covered = if covered.end() > limit {
                covered
                    .split_at_row(limit)
                    .map_err(|error| error.to_string())?
                    .0
            } else {
                covered
            };
            control.sent_end = covered.end();
            Some((covered, limit))
        }
    };
    let Some((covered, limit)) = decided else {
        return Ok(Fed::Done);
    };
    let end = covered.end();
    let write = Write::Batch {
        task_id: assignment.task_id,
        first_row: covered.first_row,
        row_count: covered.row_count,
        batch: covered.batch,
    };
    let blocked = Instant::now();
    let sent = writer.send(write).await;
    stages.transform.wait(blocked.elapsed());
    if sent.is_err() {
        return Err("the ring writer stopped".to_owned());
    }
    Ok(if end >= limit { Fed::Done } else { Fed::More })
}

/// Opens the job's sources and checks its transforms against the first source's schema.
async fn open_pipeline(
    data: &v1::JobData,
    decode: tokio::runtime::Handle,
) -> Result<Pipeline, DaemonError> {
    let sources = open_sources(data).await?;
    let shape = Shape::from_job(data).map_err(DaemonError::Transform)?;
    let first = sources
        .first()
        .ok_or_else(|| DaemonError::Refused("the job has no sources".to_owned()))?;
    let schema = shape
        .transforms
        .output_schema(&first.schema)
        .map_err(DaemonError::Transform)?;
    Ok(Pipeline {
        sources,
        shape,
        schema,
        stages: Arc::default(),
        decode,
    })
}

async fn open_sources(data: &v1::JobData) -> Result<Vec<Source>, DaemonError> {
    let mut sources = Vec::new();
    for source in &data.sources {
        let source_error = |error| DaemonError::Source {
            uri: source.uri.clone(),
            source: error,
        };
        let format = sluice_formats::FormatKind::parse(&source.format).map_err(source_error)?;
        let open = OpenOptions {
            storage_options: source
                .storage_options
                .iter()
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect(),
            format: Some(format),
            version: source.version,
            ..OpenOptions::default()
        };
        let dataset = Dataset::open(&source.uri, &open)
            .await
            .map_err(source_error)?;
        let filter = source
            .filter
            .as_deref()
            .map(Expr::parse)
            .transpose()
            .map_err(source_error)?;
        let options = ReadOptions {
            columns: (!source.columns.is_empty()).then(|| source.columns.clone()),
            filter,
            batch_rows: data.batch_size.max(1) as usize,
        };
        let schema = dataset.output_schema(&options).map_err(source_error)?;
        sources.push(Source {
            dataset,
            options,
            schema,
        });
    }
    Ok(sources)
}

/// Creates the ring of `rank`, or opens the one a previous daemon left without a ledger of this
/// node, and gives it an empty ledger owned by `node`.
fn open_ring(
    job_dir: &Path,
    rank: u32,
    size: u64,
    node: u64,
) -> Result<(Ring, Ledger), DaemonError> {
    let path = job_dir.join(format!("{rank}.{RING_EXTENSION}"));
    let ring_error = |error: &dyn std::fmt::Display| DaemonError::Ring(error.to_string());
    let ring = if path.exists() {
        Ring::open(&path).map_err(|error| ring_error(&error))?
    } else {
        RingOptions::new(&path)
            .capacity(size)
            .create()
            .map_err(|error| ring_error(&error))?
    };
    let ledger =
        Ledger::create(Ledger::path_beside(&path), node).map_err(|error| ring_error(&error))?;
    Ok((ring, ledger))
}

/// A client of the AM's daemon service that presents the shared token.
type AmClient = DaemonServiceClient<InterceptedService<Channel, BearerToken>>;

/// Connects to the AM, trying again with backoff up to the timeout.
async fn connect(options: &DaemonOptions) -> Result<AmClient, DaemonError> {
    let endpoint = if options.am.contains("://") {
        options.am.clone()
    } else {
        format!("http://{}", options.am)
    };
    let started = std::time::Instant::now();
    let mut backoff = Duration::from_millis(20);
    loop {
        let attempt = Channel::from_shared(endpoint.clone())
            .map_err(|error| DaemonError::Unreachable {
                am: options.am.clone(),
                seconds: 0,
                reason: error.to_string(),
            })?
            .connect()
            .await;
        match attempt {
            Ok(channel) => {
                return Ok(DaemonServiceClient::with_interceptor(
                    channel,
                    BearerToken(options.token.clone()),
                ));
            }
            Err(error) if started.elapsed() < options.am_timeout => {
                tracing::debug!(%error, "AM not reachable yet");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Err(error) => {
                return Err(DaemonError::Unreachable {
                    am: options.am.clone(),
                    seconds: options.am_timeout.as_secs(),
                    reason: error.to_string(),
                });
            }
        }
    }
}

/// Makes one call, trying again while the AM is unavailable, up to the timeout.
async fn call<T, F, Fut>(options: &DaemonOptions, mut make: F) -> Result<T, DaemonError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let started = std::time::Instant::now();
    let mut backoff = Duration::from_millis(20);
    loop {
        match make().await {
            Ok(reply) => return Ok(reply.into_inner()),
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
                ) && started.elapsed() < options.am_timeout =>
            {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Err(status) => return Err(DaemonError::Refused(status.message().to_owned())),
        }
    }
}

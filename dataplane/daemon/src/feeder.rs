//! The feeders: one per ring, each reads the tasks given to its ring, through the job's pipeline
//! (read, permute, transform, batch), and hands their batches to the ring's writer, cut at a task's
//! stop row.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_formats::{BlockCache, SplitBatch};
use sluice_proto::{TaskId, v1};
use tokio::sync::mpsc;

use crate::error::{DaemonError, FeedError, Result};
use crate::pipeline::{Shape, Skipped, TaskFeed};
use crate::shuffle::Interleave;
use crate::sources::{Source, open_source, open_sources};
use crate::stats::Stages;
use crate::writer::Write;

/// What the feeder and the main loop share about a task.
#[derive(Debug, Default)]
pub(crate) struct Control {
    /// The split row (exclusive) the feeder stops at, once a stop was asked for.
    pub(crate) stop: Option<u64>,
    /// The end of the rows handed to the writer.
    pub(crate) sent_end: u64,
    /// Why reading failed.
    pub(crate) failed: Option<String>,
    /// The rows the feeder skipped because they did not decode, not yet taken by the main loop.
    pub(crate) skipped: Vec<v1::BadRange>,
}

/// Which task a ring's feeder waits for the next batch of, from its source, and since when: a read
/// that makes no progress in a live daemon shows here, for hang detection.
#[derive(Debug, Default)]
pub struct SourceWait(Mutex<Option<(TaskId, Instant)>>);

impl SourceWait {
    fn begin(&self, task: TaskId) {
        *self.lock() = Some((task, Instant::now()));
    }

    fn end(&self) {
        *self.lock() = None;
    }

    /// The task waited for and for how long, while the feeder waits for one.
    pub fn waiting(&self) -> Option<(TaskId, Duration)> {
        self.lock().map(|(task, since)| (task, since.elapsed()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(TaskId, Instant)>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A task on its way to a ring's feeder.
#[derive(Debug)]
pub(crate) struct Job {
    /// The task, from the row to read first.
    pub(crate) assignment: v1::TaskAssignment,
    /// What the feeder shares with the main loop about it.
    pub(crate) control: Arc<Mutex<Control>>,
}

/// A source added to the running job, opened by the first task that reads it.
#[derive(Debug)]
struct AddedSource {
    data: v1::SourceData,
    opened: tokio::sync::OnceCell<Arc<Source>>,
}

/// The job's sources and how every task is shaped.
#[derive(Debug)]
pub(crate) struct Pipeline {
    /// The sources the job had when the daemon registered.
    sources: Vec<Arc<Source>>,
    /// The sources added to the running job that the daemon was told of, by index.
    added: Mutex<BTreeMap<u32, Arc<AddedSource>>>,
    /// The job's data: how an added source is opened.
    data: v1::JobData,
    /// How every task is shaped.
    pub(crate) shape: Shape,
    /// The schema of the batches written to the rings: the first source's, after the transforms.
    pub(crate) schema: arrow::datatypes::SchemaRef,
    /// How busy the stages after fetch are.
    pub(crate) stages: Arc<Stages>,
    /// Where tasks are read and decoded.
    decode: tokio::runtime::Handle,
    /// The local disk cache of remote sources, when the daemon has one.
    pub(crate) cache: Option<Arc<BlockCache>>,
}

impl Pipeline {
    /// Every stage's figures so far, fetch included.
    pub(crate) fn stage_stats(&self) -> Vec<v1::StageStats> {
        let added: Vec<Arc<Source>> = self
            .lock_added()
            .values()
            .filter_map(|source| source.opened.get().cloned())
            .collect();
        let opened = || self.sources.iter().chain(&added);
        let fetch_busy = opened()
            .map(|source| source.dataset.fetch_stats().busy())
            .sum();
        let fetch_bytes = opened()
            .map(|source| source.dataset.fetch_stats().bytes())
            .sum();
        self.stages.report(fetch_busy, fetch_bytes)
    }

    /// Learns the sources added to the running job that tasks about to come read; each is opened
    /// by the first of its tasks.
    pub(crate) fn learn_sources(&self, sources: Vec<v1::AddedSource>) {
        let mut added = self.lock_added();
        for source in sources {
            let Some(data) = source.data else { continue };
            if (source.index as usize) < self.sources.len() {
                continue;
            }
            added.entry(source.index).or_insert_with(|| {
                tracing::info!(index = source.index, uri = %data.uri, "a source was added to the job");
                Arc::new(AddedSource {
                    data,
                    opened: tokio::sync::OnceCell::new(),
                })
            });
        }
    }

    /// Source `index`, for task `task_id`: one of the job's, or an added one, opened now if no task
    /// opened it yet (a failed opening is tried again by the next task).
    async fn source(&self, index: u32, task_id: u64) -> Result<Arc<Source>, FeedError> {
        if let Some(source) = self.sources.get(index as usize) {
            return Ok(source.clone());
        }
        let added = self
            .lock_added()
            .get(&index)
            .cloned()
            .ok_or(FeedError::UnknownSource {
                task_id,
                source_index: index,
            })?;
        let unfit = |reason: String| FeedError::AddedSource {
            task_id,
            source_index: index,
            uri: added.data.uri.clone(),
            reason,
        };
        let opened = added
            .opened
            .get_or_try_init(|| async {
                let source = open_source(&added.data, &self.data, self.cache.as_ref())
                    .await
                    .map_err(|error| unfit(error.to_string()))?;
                let schema = self
                    .shape
                    .transforms
                    .output_schema(&source.schema)
                    .map_err(|error| unfit(error.to_string()))?;
                // The AM's rule: the same names and types, in order.
                let columns = |schema: &arrow::datatypes::Schema| -> Vec<(String, arrow::datatypes::DataType)> {
                    schema
                        .fields()
                        .iter()
                        .map(|field| (field.name().clone(), field.data_type().clone()))
                        .collect()
                };
                if columns(&schema) != columns(&self.schema) {
                    return Err(unfit(format!(
                        "its batches would have the schema {schema}, the job's rings carry {}",
                        self.schema
                    )));
                }
                Ok(Arc::new(source))
            })
            .await?;
        Ok(opened.clone())
    }

    fn lock_added(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Arc<AddedSource>>> {
        self.added
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Locks a task's control, also after a thread panicked holding it.
pub(crate) fn lock(control: &Mutex<Control>) -> std::sync::MutexGuard<'_, Control> {
    control
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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
pub(crate) async fn feed(
    mut jobs: mpsc::UnboundedReceiver<Job>,
    writer: mpsc::Sender<Write>,
    pipeline: Arc<Pipeline>,
    mut epoch: Option<u32>,
    source_wait: Arc<SourceWait>,
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
            let pump = Pump::start(&job, pipeline.clone());
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
                let pump = Pump::start(&job, pipeline.clone());
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
            &source_wait,
        )
        .await
        {
            Ok(Fed::More) => {}
            Ok(Fed::Done) => {
                open.remove(pick);
            }
            Err(error) => {
                fail(job, &error);
                open.remove(pick);
            }
        }
    }
}

/// The runtime tasks are read and decoded on: one worker per core, apart from the daemon's own.
/// Stopped without waiting when dropped, which may happen on the daemon's runtime.
pub(crate) struct DecodeRuntime(Option<tokio::runtime::Runtime>);

impl DecodeRuntime {
    /// Starts the runtime's threads.
    pub(crate) fn start() -> Result<DecodeRuntime> {
        let cores = std::thread::available_parallelism().map_or(1, |cores| cores.get());
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cores)
            .thread_name("sluice-decode")
            .enable_all()
            .build()
            .map(|runtime| DecodeRuntime(Some(runtime)))
            .map_err(DaemonError::Threads)
    }

    /// Where to spawn on the runtime.
    pub(crate) fn handle(&self) -> tokio::runtime::Handle {
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
    batches: mpsc::Receiver<Result<SplitBatch, FeedError>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Pump {
    fn start(job: &Job, pipeline: Arc<Pipeline>) -> Pump {
        let assignment = job.assignment.clone();
        let control = Arc::clone(&job.control);
        let skipped: Skipped = Arc::new(move |range| lock(&control).skipped.push(range));
        let (sender, batches) = mpsc::channel(READ_AHEAD_BATCHES);
        let reader = pipeline.decode.clone().spawn(async move {
            // Opening reads the footer, and with a shuffle the whole split.
            let opening = Instant::now();
            let opened = open_task(&assignment, &pipeline, skipped).await;
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
fn fail(job: &Job, error: &FeedError) {
    let reason = error.to_string();
    tracing::warn!(task = job.assignment.task_id, %reason, "task failed");
    lock(&job.control).failed = Some(reason);
}

/// Opens the reading of one task.
async fn open_task(
    assignment: &v1::TaskAssignment,
    pipeline: &Pipeline,
    skipped: Skipped,
) -> Result<TaskFeed, FeedError> {
    let split = assignment.split.as_ref().ok_or(FeedError::NoSplit {
        task_id: assignment.task_id,
    })?;
    let source = pipeline
        .source(split.source_index, assignment.task_id)
        .await?;
    TaskFeed::open(assignment, &source, &pipeline.shape, skipped).await
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
    source_wait: &SourceWait,
) -> Result<Fed, FeedError> {
    source_wait.begin(TaskId(assignment.task_id));
    let next = task.batches.recv().await;
    source_wait.end();
    let Some(covered) = next.transpose()? else {
        return Ok(Fed::Done);
    };
    let decided = {
        let mut control = lock(control);
        let limit = control.stop.unwrap_or(assignment.end);
        if covered.first_row >= limit {
            None
        } else {
            let covered = if covered.end() > limit {
                covered.split_at_row(limit)?.0
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
        return Err(FeedError::WriterStopped);
    }
    Ok(if end >= limit { Fed::Done } else { Fed::More })
}

/// Opens the job's sources and checks its transforms against the first source's schema.
pub(crate) async fn open_pipeline(
    data: &v1::JobData,
    decode: tokio::runtime::Handle,
    cache: Option<Arc<BlockCache>>,
) -> Result<Pipeline> {
    let sources = open_sources(data, cache.as_ref()).await?;
    let shape = Shape::from_job(data).map_err(DaemonError::Transform)?;
    let first = sources.first().ok_or(DaemonError::NoSources)?;
    let schema = shape
        .transforms
        .output_schema(&first.schema)
        .map_err(DaemonError::Transform)?;
    Ok(Pipeline {
        sources: sources.into_iter().map(Arc::new).collect(),
        added: Mutex::default(),
        data: data.clone(),
        shape,
        schema,
        stages: Arc::default(),
        decode,
        cache,
    })
}

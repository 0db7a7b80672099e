//! The feeders: one per ring, each reads the tasks given to its ring, through the job's pipeline
//! (read, permute, transform, batch), and hands their batches to the ring's writer, cut at a task's
//! stop row.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::{BooleanArray, RecordBatch, RecordBatchOptions};
use arrow::buffer::BooleanBuffer;
use arrow::datatypes::SchemaRef;
use sluice_formats::{BlockCache, SplitBatch};
use sluice_proto::{TaskId, v1};
use tokio::sync::{mpsc, watch};

use crate::error::{DaemonError, FeedError, Result};
use crate::pipeline::{PAD_COLUMN, Shape, Skipped, TaskFeed, batch_bytes};
use crate::shuffle::Interleave;
use crate::sources::{Source, open_source, open_sources};
use crate::stats::Stages;
use crate::tune::{Taken, Tuning};
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
    /// The rows the ring left out of their epoch (`data.even_batches: drop`), not yet taken by
    /// the main loop.
    pub(crate) dropped: Vec<v1::RowSpan>,
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
    /// The schema of the batches the transforms make of the first source's.
    pub(crate) schema: SchemaRef,
    /// The schema of the batches written to the rings: `schema`, with the pad column when the job
    /// pads.
    pub(crate) ring_schema: SchemaRef,
    /// A batch the transforms made, once one was read: what a ring that read none pads with.
    sample: std::sync::OnceLock<RecordBatch>,
    /// How busy the stages after fetch are.
    pub(crate) stages: Arc<Stages>,
    /// Where tasks are read and decoded.
    decode: tokio::runtime::Handle,
    /// The budgets task reads take from, tuned at run time.
    pub(crate) tuning: Arc<Tuning>,
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

    /// Whether source `index` is read from local files, whose reads the decode permits bound: a
    /// read from an object store waits on the network most of its time, so each open task keeps
    /// its own, as many at once as there are open tasks.
    fn reads_locally(&self, index: u32) -> bool {
        match self.data.sources.get(index as usize) {
            Some(source) => sluice_store::is_local(&source.uri),
            None => self
                .lock_added()
                .get(&index)
                .is_some_and(|added| sluice_store::is_local(&added.data.uri)),
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

    /// `batch` as the rings carry it: with the pad column, all `pad`, when the job pads.
    fn ring_batch(
        &self,
        batch: RecordBatch,
        pad: bool,
    ) -> Result<RecordBatch, arrow::error::ArrowError> {
        if !self.shape.even {
            return Ok(batch);
        }
        let rows = batch.num_rows();
        let mut columns = batch.columns().to_vec();
        let mask = if pad {
            BooleanBuffer::new_set(rows)
        } else {
            BooleanBuffer::new_unset(rows)
        };
        columns.push(Arc::new(BooleanArray::new(mask, None)));
        RecordBatch::try_new_with_options(
            self.ring_schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )
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
///
/// With `data.even_batches`, the feeder counts the batches it makes in each epoch (`counted`), and
/// ends an epoch only once the AM settled its count (`settled`): with `pad`, it first hands the
/// writer pad batches up to it. An idle feeder pads as soon as the count is settled, and ends the
/// epochs in which its ring gets no task once the AM has moved past them.
///
/// With `drop`, a batch numbered past what the AM allows every ring so far is held back, in the
/// feeder's memory and outside the read-ahead budget, at most [`HOLD_CAP`] of them but for a wait
/// that ran out, and handed to the writer once the AM allows it. Once the count is settled, the
/// batches past it are dropped: the writer gets a record of their rows that the trainer's reader
/// counts as read, and the main loop reports them to the AM.
pub(crate) async fn feed(
    mut jobs: mpsc::UnboundedReceiver<Job>,
    writer: mpsc::Sender<Write>,
    pipeline: Arc<Pipeline>,
    epoch: Option<u32>,
    rings: RingFeed,
) {
    let window = pipeline.shape.window();
    let seed = pipeline.shape.shuffle.map_or(0, |shuffle| shuffle.seed);
    let mut feeder = Feeder {
        writer,
        pipeline,
        epoch,
        interleave: Interleave::new(seed, epoch.unwrap_or(0)),
        seed,
        rings,
        last: None,
        held: VecDeque::new(),
    };
    let mut open: Vec<(Job, Pump)> = Vec::new();
    let mut next_epoch: Option<Job> = None;
    loop {
        while open.len() <= window && next_epoch.is_none() {
            let job = if open.is_empty() {
                let idle = Instant::now();
                let job = feeder.idle(&mut jobs).await;
                feeder.pipeline.stages.read.wait(idle.elapsed());
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
            if feeder.epoch != Some(job.assignment.epoch) && !open.is_empty() {
                next_epoch = Some(job);
                break;
            }
            if !feeder.enter(job.assignment.epoch).await {
                return;
            }
            let pump = Pump::start(&job, feeder.pipeline.clone());
            open.push((job, pump));
        }
        if open.is_empty() {
            // Every task of the epoch ended: the next epoch's first task opens it.
            if let Some(job) = next_epoch.take() {
                if !feeder.enter(job.assignment.epoch).await {
                    return;
                }
                let pump = Pump::start(&job, feeder.pipeline.clone());
                open.push((job, pump));
            }
            continue;
        }
        let pick = feeder.interleave.pick(open.len().min(window));
        let (job, task) = &mut open[pick];
        match feeder.feed_task(job, task).await {
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

/// The batches a ring's feeder holds back (`data.even_batches: drop`) before it waits for the AM to
/// allow more: a ring's final count is at most this many past the fewest, but for the rows no
/// ring could be given.
pub(crate) const HOLD_CAP: usize = 4;

/// How long a feeder holding [`HOLD_CAP`] batches waits for the AM before it reads one more: a few
/// heartbeats, in which a ring that ran dry gets a cut of the rows its tasks still have.
const HOLD_WAIT: Duration = Duration::from_secs(2);

/// What a ring's feeder shares with the rest of the daemon.
#[derive(Debug, Clone)]
pub(crate) struct RingFeed {
    /// What the feeder waits for from the sources.
    pub(crate) source_wait: Arc<SourceWait>,
    /// The batches handed to the writer per epoch.
    pub(crate) counted: Arc<EpochCount>,
    /// The counts the AM settled, with `data.even_batches`.
    pub(crate) settled: watch::Receiver<Settled>,
    /// The batches the feeder holds back, with `data.even_batches: drop`: while it holds any, its
    /// ring does not count as dry.
    pub(crate) held: Arc<AtomicUsize>,
    /// With `data.even_batches: drop` on a node that feeds every rank of the job, the counts of
    /// all the job's rings.
    pub(crate) local: Option<Arc<LocalFloor>>,
}

/// The rings of a node that feeds every rank of the job (`data.even_batches: drop`): the fewest
/// batches any of them made in an epoch is what every ring may write, known here at once rather
/// than a heartbeat later from the AM, which allows the same from the same counts.
#[derive(Debug)]
pub(crate) struct LocalFloor {
    /// Every ring's count.
    pub(crate) counts: Vec<Arc<EpochCount>>,
    /// Where the feeders learn what they may write.
    pub(crate) told: Arc<watch::Sender<Settled>>,
}

impl LocalFloor {
    /// A ring made a batch of `epoch`: raises what every ring may write to the fewest any made.
    /// A ring not in `epoch` (before it, or two epochs past it) counts 0 there, which raises
    /// nothing; counts only grow, so the fewest never overstates the final one.
    pub(crate) fn counted(&self, epoch: u32) {
        let fewest = self
            .counts
            .iter()
            .map(|counted| counted.batches(epoch))
            .min()
            .unwrap_or(0);
        self.told.send_if_modified(|settled| {
            let allowed = settled.allowed.entry(epoch).or_default();
            let raised = fewest > *allowed;
            *allowed = (*allowed).max(fewest);
            raised
        });
    }
}

/// A batch a ring's feeder holds back (`data.even_batches: drop`): its number in the epoch is past
/// what the AM allows every ring so far.
struct Held {
    number: u64,
    batch: RecordBatch,
    task_id: u64,
    first_row: u64,
    row_count: u64,
    tag: u64,
    control: Arc<Mutex<Control>>,
}

/// One ring's feeder between tasks: the epoch it is in and where its batches go.
struct Feeder {
    writer: mpsc::Sender<Write>,
    pipeline: Arc<Pipeline>,
    epoch: Option<u32>,
    interleave: Interleave,
    seed: u64,
    rings: RingFeed,
    /// The last batch handed to the writer, as the transforms left it: what a pad repeats.
    last: Option<RecordBatch>,
    /// The batches held back, in their order (`data.even_batches: drop`), all of the ring's
    /// current epoch.
    held: VecDeque<Held>,
}

impl Feeder {
    /// Waits for the next task while no task is open; with `data.even_batches: pad`, pads the
    /// epoch meanwhile once its count is settled, and ends the epochs the ring gets no task in.
    /// `None` once the queue is closed or the writer stopped.
    async fn idle(&mut self, jobs: &mut mpsc::UnboundedReceiver<Job>) -> Option<Job> {
        if !self.pipeline.shape.even {
            return jobs.recv().await;
        }
        loop {
            if !self.pad_while_idle().await {
                return None;
            }
            tokio::select! {
                job = jobs.recv() => return job,
                changed = self.rings.settled.changed() => {
                    if changed.is_err() {
                        return jobs.recv().await;
                    }
                }
            }
        }
    }

    /// Pads what the settled counts allow while the ring has no task (or drops, or hands the
    /// writer what the AM allows, with `drop`): the current epoch up to its count, and every epoch
    /// the AM moved past, each then ended. A ring that has counted nothing yet starts in the AM's
    /// current epoch. False once the writer stopped.
    async fn pad_while_idle(&mut self) -> bool {
        loop {
            let settled = self.rings.settled.borrow_and_update().clone();
            let Some(current) = settled.current else {
                return self.release().await;
            };
            let epoch = match self.epoch {
                Some(epoch) => epoch,
                None => {
                    self.begin(current);
                    current
                }
            };
            let Some(&count) = settled.epochs.get(&epoch) else {
                return self.release().await;
            };
            if !self.close_out(epoch, count).await {
                return false;
            }
            if epoch >= current {
                return true;
            }
            if !self.end_epoch(epoch).await {
                return false;
            }
            self.begin(epoch + 1);
        }
    }

    /// Enters `epoch` for a task of it: when the ring is in another, ends that one first (closed
    /// out at its settled count with `data.even_batches`), and every epoch between in which the
    /// ring got no task, so that its trainer counts the epochs the job does. False once the
    /// writer stopped.
    async fn enter(&mut self, epoch: u32) -> bool {
        if self.epoch == Some(epoch) {
            return true;
        }
        if let Some(ending) = self.epoch {
            if self.pipeline.shape.even {
                let Some(count) = self.settled_count(ending).await else {
                    return false;
                };
                if !self.close_out(ending, count).await {
                    return false;
                }
            }
            if !self.end_epoch(ending).await {
                return false;
            }
            // With `data.even_batches: pad`, the idle ring already ended (and padded) the epochs
            // the AM moved past.
            if !self.pipeline.shape.even {
                for empty in ending.saturating_add(1)..epoch {
                    if !self.end_epoch(empty).await {
                        return false;
                    }
                }
            }
        }
        self.begin(epoch);
        true
    }

    /// Writes the end of `epoch`, tagged with it in every job: a daemon that takes the ring over
    /// right after it learns from the tag which epoch the ring is in. False once the writer
    /// stopped.
    async fn end_epoch(&mut self, epoch: u32) -> bool {
        let tag = StreamPoint::Ended { epoch }.tag();
        self.writer.send(Write::EndOfEpoch { tag }).await.is_ok()
    }

    /// The tag of a batch at `point` of the stream: only with `data.even_batches`, whose counts a
    /// daemon that takes the ring over reads back from the tags.
    fn tag(&self, point: StreamPoint) -> u64 {
        if self.pipeline.shape.even {
            point.tag()
        } else {
            0
        }
    }

    fn begin(&mut self, epoch: u32) {
        self.epoch = Some(epoch);
        self.interleave = Interleave::new(self.seed, epoch);
        if self.pipeline.shape.even {
            self.rings.counted.begin(epoch);
        }
    }

    /// Counts one batch of `epoch` for `data.even_batches` and returns its number in the epoch;
    /// without it nothing is counted, and heartbeats carry no counts.
    fn count(&self, epoch: u32) -> u64 {
        if self.pipeline.shape.even {
            self.rings.counted.count(epoch)
        } else {
            0
        }
    }

    /// Waits until the AM settled `epoch`'s count, handing the writer meanwhile the held batches
    /// the AM allows; `None` if the daemon stopped listening or the writer stopped.
    async fn settled_count(&mut self, epoch: u32) -> Option<u64> {
        loop {
            if !self.release().await {
                return None;
            }
            if let Some(&count) = self.rings.settled.borrow_and_update().epochs.get(&epoch) {
                return Some(count);
            }
            self.rings.settled.changed().await.ok()?;
        }
    }

    /// Hands the writer the held batches that the AM allows every ring now. False once the writer
    /// stopped.
    async fn release(&mut self) -> bool {
        let Some(epoch) = self.epoch else {
            return true;
        };
        let allowed = self.rings.settled.borrow().allows(epoch);
        while self.held.front().is_some_and(|held| held.number <= allowed) {
            let Some(held) = self.unhold() else {
                break;
            };
            if !self.write_held(held).await {
                return false;
            }
        }
        true
    }

    /// Ends the holding of `epoch` at its settled `count`: with `drop`, the held batches up to it go
    /// to the writer and the others are dropped, and with either mode a ring that has fewer pads up
    /// to it. False once the writer stopped.
    async fn close_out(&mut self, epoch: u32, count: u64) -> bool {
        while let Some(held) = self.unhold() {
            let written = if held.number <= count {
                self.write_held(held).await
            } else {
                // Told before the writer has the record: the heartbeat that reports the rows read
                // reports them dropped. A task's batches follow each other: one span for them all.
                {
                    let mut control = lock(&held.control);
                    match control.dropped.last_mut() {
                        Some(last) if last.first_row + last.row_count == held.first_row => {
                            last.row_count += held.row_count;
                        }
                        _ => control.dropped.push(v1::RowSpan {
                            first_row: held.first_row,
                            row_count: held.row_count,
                        }),
                    }
                }
                let dropped = Write::Dropped {
                    task_id: held.task_id,
                    first_row: held.first_row,
                    row_count: held.row_count,
                };
                self.writer.send(dropped).await.is_ok()
            };
            if !written {
                return false;
            }
        }
        self.pad_to(epoch, count).await
    }

    /// With `drop`, waits while the ring holds [`HOLD_CAP`] batches back, for the AM to allow more:
    /// the rows of its tasks not handed yet stay with them, where the AM can cut them off for a ring
    /// that runs dry, and the epoch's counts end close. After [`HOLD_WAIT`] without, it goes on by
    /// one batch: a task whose rest can be cut no more must end for the epoch to settle. False once
    /// the writer stopped.
    async fn wait_for_room(&mut self) -> bool {
        let deadline = tokio::time::Instant::now() + HOLD_WAIT;
        while self.held.len() >= HOLD_CAP {
            match tokio::time::timeout_at(deadline, self.rings.settled.changed()).await {
                Ok(Ok(())) => {
                    if !self.release().await {
                        return false;
                    }
                }
                Ok(Err(_)) | Err(_) => return true,
            }
        }
        true
    }

    /// Holds `held` back, behind the others; the ring's count of held batches follows.
    fn hold(&mut self, held: Held) {
        self.held.push_back(held);
        self.rings.held.store(self.held.len(), Ordering::Relaxed);
    }

    /// The first batch held back, held no more; the ring's count of held batches follows.
    fn unhold(&mut self) -> Option<Held> {
        let held = self.held.pop_front();
        self.rings.held.store(self.held.len(), Ordering::Relaxed);
        held
    }

    /// Hands the writer a batch it held back. False once the writer stopped.
    async fn write_held(&mut self, held: Held) -> bool {
        let write = Write::Batch {
            batch: held.batch,
            task_id: held.task_id,
            first_row: held.first_row,
            row_count: held.row_count,
            tag: held.tag,
        };
        self.writer.send(write).await.is_ok()
    }

    /// The next batch of `task`; with batches held, hands the writer meanwhile those the AM comes
    /// to allow.
    async fn next_batch(&mut self, task: &mut Pump) -> Result<Option<Ahead>, FeedError> {
        loop {
            if self.held.is_empty() {
                return Ok(task.batches.recv().await);
            }
            tokio::select! {
                next = task.batches.recv() => return Ok(next),
                changed = self.rings.settled.changed() => {
                    if changed.is_err() {
                        return Ok(task.batches.recv().await);
                    }
                    if !self.release().await {
                        return Err(FeedError::WriterStopped);
                    }
                }
            }
        }
    }

    /// Hands the writer pad batches until the ring has `count` in `epoch`. False once the writer
    /// stopped.
    async fn pad_to(&mut self, epoch: u32, count: u64) -> bool {
        while self.rings.counted.batches(epoch) < count {
            let rows = self
                .last
                .clone()
                .or_else(|| self.pipeline.sample.get().cloned())
                .unwrap_or_else(|| RecordBatch::new_empty(self.pipeline.schema.clone()));
            let batch = match self.pipeline.ring_batch(rows, true) {
                Ok(batch) => batch,
                Err(error) => {
                    tracing::error!(%error, "a pad batch could not be made");
                    return false;
                }
            };
            let number = self.count(epoch);
            let pad = Write::Batch {
                batch,
                task_id: 0,
                first_row: 0,
                row_count: 0,
                tag: self.tag(StreamPoint::Batch { epoch, number }),
            };
            if self.writer.send(pad).await.is_err() {
                return false;
            }
        }
        true
    }

    /// Hands the next batch of one task to the writer, cut at the task's stop row.
    ///
    /// Every batch covers the task rows from the end of the one before, rows the filter or a
    /// deletion vector removed included, so the positions the writer records are exact: a stop at
    /// row k sends exactly the rows before k, and the daemon that is given `[k, end)` reads exactly
    /// the rest. The batch is counted in its epoch before its rows count as handed, so that a
    /// report that reads the handed rows first and the counts after counts every batch of them.
    async fn feed_task(&mut self, job: &Job, task: &mut Pump) -> Result<Fed, FeedError> {
        if self.pipeline.shape.drop && !self.wait_for_room().await {
            return Err(FeedError::WriterStopped);
        }
        let assignment = &job.assignment;
        let source_wait = self.rings.source_wait.clone();
        source_wait.begin(TaskId(assignment.task_id));
        let next = self.next_batch(task).await?;
        source_wait.end();
        // The batch's read-ahead bytes are given back once the writer has it.
        let Some(Ahead {
            batch: covered,
            read_ahead: _read_ahead,
        }) = next
        else {
            return Ok(Fed::Done);
        };
        let covered = covered?;
        let decided = {
            let mut control = lock(&job.control);
            let limit = control.stop.unwrap_or(assignment.end);
            if covered.first_row >= limit {
                None
            } else {
                let covered = if covered.end() > limit {
                    covered.split_at_row(limit)?.0
                } else {
                    covered
                };
                let number = self.count(assignment.epoch);
                control.sent_end = covered.end();
                Some((
                    covered,
                    limit,
                    StreamPoint::Batch {
                        epoch: assignment.epoch,
                        number,
                    },
                ))
            }
        };
        let Some((covered, limit, point)) = decided else {
            return Ok(Fed::Done);
        };
        let end = covered.end();
        if self.pipeline.shape.even {
            self.pipeline.sample.get_or_init(|| covered.batch.clone());
            self.last = Some(covered.batch.clone());
        }
        let batch = self
            .pipeline
            .ring_batch(covered.batch, false)
            .map_err(|error| FeedError::PadColumn {
                task_id: assignment.task_id,
                error,
            })?;
        let fed = if end >= limit { Fed::Done } else { Fed::More };
        if self.pipeline.shape.drop
            && let StreamPoint::Batch { epoch, number } = point
        {
            if let Some(local) = &self.rings.local {
                local.counted(epoch);
            }
            let tag = self.tag(point);
            self.hold(Held {
                number,
                batch,
                task_id: assignment.task_id,
                first_row: covered.first_row,
                row_count: covered.row_count,
                tag,
                control: job.control.clone(),
            });
            if !self.release().await {
                return Err(FeedError::WriterStopped);
            }
            return Ok(fed);
        }
        let write = Write::Batch {
            task_id: assignment.task_id,
            first_row: covered.first_row,
            row_count: covered.row_count,
            batch,
            tag: self.tag(point),
        };
        let blocked = Instant::now();
        let sent = self.writer.send(write).await;
        self.pipeline.stages.transform.wait(blocked.elapsed());
        if sent.is_err() {
            return Err(FeedError::WriterStopped);
        }
        Ok(fed)
    }
}

/// Where a record stands in a ring's stream of epochs, as its tag says (with `data.even_batches`):
/// a daemon that takes a ring over continues the epoch's count from the largest tag in the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamPoint {
    /// The batch numbered `number`, from 1, in `epoch` (pads included).
    Batch {
        /// The epoch.
        epoch: u32,
        /// Its number.
        number: u64,
    },
    /// The end of `epoch`.
    Ended {
        /// The epoch.
        epoch: u32,
    },
}

/// The number of an end of epoch in its tag: above any batch's.
const ENDED: u64 = u32::MAX as u64;

impl StreamPoint {
    /// The tag: the epoch plus one in the high 32 bits (so that no tag is 0), the batch's number or
    /// [`ENDED`] in the low ones. Tags grow along the stream, as a ledger's largest one needs.
    pub(crate) fn tag(self) -> u64 {
        let (epoch, low) = match self {
            StreamPoint::Batch { epoch, number } => (epoch, number.min(ENDED - 1)),
            StreamPoint::Ended { epoch } => (epoch, ENDED),
        };
        ((u64::from(epoch) + 1) << 32) | low
    }

    /// The point a tag names; `None` for 0, a record without one.
    pub(crate) fn of_tag(tag: u64) -> Option<StreamPoint> {
        let epoch = u32::try_from((tag >> 32).checked_sub(1)?).ok()?;
        Some(match tag & ENDED {
            ENDED => StreamPoint::Ended { epoch },
            number => StreamPoint::Batch { epoch, number },
        })
    }
}

/// The counts of `data.even_batches` the AM settled, as it last told them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Settled {
    /// The AM's current epoch, once it told it: where a ring that has counted nothing starts.
    pub(crate) current: Option<u32>,
    /// The count of every epoch settled.
    pub(crate) epochs: BTreeMap<u32, u64>,
    /// With `drop`, the batches every ring may write in an epoch not settled yet.
    pub(crate) allowed: BTreeMap<u32, u64>,
}

impl Settled {
    /// Takes what the AM tells; counts only grow. Whether anything changed.
    pub(crate) fn merge(&mut self, told: &v1::SettledBatches) -> bool {
        let before = self.clone();
        self.current = Some(self.current.map_or(told.current_epoch, |current| {
            current.max(told.current_epoch)
        }));
        for counted in &told.epochs {
            let count = self.epochs.entry(counted.epoch).or_default();
            *count = (*count).max(counted.batches);
        }
        for counted in &told.allowed {
            let allowed = self.allowed.entry(counted.epoch).or_default();
            *allowed = (*allowed).max(counted.batches);
        }
        *self != before
    }

    /// The batches a ring may write in `epoch` (`data.even_batches: drop`): its settled count once
    /// there is one, before that what the AM allowed.
    pub(crate) fn allows(&self, epoch: u32) -> u64 {
        self.epochs
            .get(&epoch)
            .or_else(|| self.allowed.get(&epoch))
            .copied()
            .unwrap_or(0)
    }
}

/// The batches a ring's feeder handed to its writer in its last two epochs, pads included: what
/// the AM settles `data.even_batches` on.
#[derive(Debug, Default)]
pub struct EpochCount(Mutex<[Option<(u32, u64)>; 2]>);

impl EpochCount {
    /// Starts counting `epoch`, if it is not the one counted: the one before becomes the previous.
    pub(crate) fn begin(&self, epoch: u32) {
        let mut counts = self.lock();
        if counts[1].is_some_and(|(counted, _)| counted == epoch) {
            return;
        }
        counts[0] = counts[1];
        counts[1] = Some((epoch, 0));
    }

    /// Counts one batch of `epoch`; returns its number in the epoch, from 1.
    pub(crate) fn count(&self, epoch: u32) -> u64 {
        self.begin(epoch);
        let mut counts = self.lock();
        let (_, batches) = counts[1].get_or_insert((epoch, 0));
        *batches += 1;
        *batches
    }

    /// Continues `epoch` from `batches` already in the ring, as a ring taken over had them.
    pub(crate) fn resume(&self, epoch: u32, batches: u64) {
        let mut counts = self.lock();
        counts[0] = None;
        counts[1] = Some((epoch, batches));
    }

    /// The batches counted in `epoch`, if it is one of the last two.
    pub(crate) fn batches(&self, epoch: u32) -> u64 {
        self.lock()
            .iter()
            .flatten()
            .find(|(counted, _)| *counted == epoch)
            .map_or(0, |(_, batches)| *batches)
    }

    /// The counts, for the AM.
    pub fn report(&self) -> Vec<v1::EpochBatches> {
        self.lock()
            .iter()
            .flatten()
            .map(|&(epoch, batches)| v1::EpochBatches { epoch, batches })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, [Option<(u32, u64)>; 2]> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The runtime tasks are read and decoded on, apart from the daemon's own: as many workers as the
/// most decode permits the tuning may give. Stopped without waiting when dropped, which may happen
/// on the daemon's runtime.
pub(crate) struct DecodeRuntime(Option<tokio::runtime::Runtime>);

impl DecodeRuntime {
    /// Starts the runtime's `threads` threads.
    pub(crate) fn start(threads: usize) -> Result<DecodeRuntime> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
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

/// How many batches a task's reader may hold ready ahead of the writer, within the daemon's
/// read-ahead bytes.
const READ_AHEAD_BATCHES: usize = 4;

/// A batch a task's reader holds ready, with the read-ahead bytes it takes.
struct Ahead {
    batch: Result<SplitBatch, FeedError>,
    read_ahead: Option<Taken>,
}

/// A task read on a tokio task of its own: opened, read, permuted, transformed and batched ahead of
/// the writer, its batches waiting in a bounded queue. Dropped, it stops reading.
struct Pump {
    batches: mpsc::Receiver<Ahead>,
    reader: tokio::task::JoinHandle<()>,
}

impl Pump {
    /// Starts reading `job`'s task. It opens its split and decodes each batch holding a decode
    /// permit (a task of local files), and holds each decoded batch's bytes of the read-ahead until
    /// the writer has it.
    fn start(job: &Job, pipeline: Arc<Pipeline>) -> Pump {
        let assignment = job.assignment.clone();
        let control = Arc::clone(&job.control);
        let skipped: Skipped = Arc::new(move |range| lock(&control).skipped.push(range));
        let (sender, batches) = mpsc::channel(READ_AHEAD_BATCHES);
        let reader = pipeline.decode.clone().spawn(async move {
            let tuning = Arc::clone(&pipeline.tuning);
            // The read-ahead bytes this task's batches hold.
            let holds = Arc::new(AtomicU64::new(0));
            let local = assignment
                .split
                .as_ref()
                .is_some_and(|split| pipeline.reads_locally(split.source_index));
            let decode_permit = || async {
                if local {
                    Some(tuning.decode.take(1, None).await)
                } else {
                    None
                }
            };
            // Opening reads the footer, and with a shuffle the whole split.
            let permit = decode_permit().await;
            let opening = Instant::now();
            let opened = open_task(&assignment, &pipeline, skipped).await;
            pipeline.stages.read.busy(opening.elapsed());
            drop(permit);
            let mut task = match opened {
                Ok(task) => task,
                Err(reason) => {
                    let failed = Ahead {
                        batch: Err(reason),
                        read_ahead: None,
                    };
                    let _ = sender.send(failed).await;
                    return;
                }
            };
            loop {
                let permit = decode_permit().await;
                let next = task.next(assignment.end, &pipeline.stages).await;
                drop(permit);
                let last = !matches!(next, Ok(Some(_)));
                let Some(batch) = next.transpose() else {
                    return;
                };
                let bytes = batch
                    .as_ref()
                    .map_or(0, |covered| batch_bytes(&covered.batch) as u64);
                let read_ahead = Some(tuning.read_ahead.take(bytes, Some(&holds)).await);
                if sender.send(Ahead { batch, read_ahead }).await.is_err() || last {
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

/// Opens the job's sources and checks its transforms against the first source's schema.
pub(crate) async fn open_pipeline(
    data: &v1::JobData,
    decode: tokio::runtime::Handle,
    tuning: Arc<Tuning>,
    cache: Option<Arc<BlockCache>>,
) -> Result<Pipeline> {
    let sources = open_sources(data, cache.as_ref()).await?;
    let shape = Shape::from_job(data).map_err(DaemonError::Transform)?;
    let first = sources.first().ok_or(DaemonError::NoSources)?;
    let schema = shape
        .transforms
        .output_schema(&first.schema)
        .map_err(DaemonError::Transform)?;
    if shape.even && schema.column_with_name(PAD_COLUMN).is_some() {
        return Err(DaemonError::PadColumnTaken {
            uri: data
                .sources
                .first()
                .map(|source| source.uri.clone())
                .unwrap_or_default(),
        });
    }
    let ring_schema = shape.ring_schema(&schema);
    Ok(Pipeline {
        sources: sources.into_iter().map(Arc::new).collect(),
        added: Mutex::default(),
        data: data.clone(),
        shape,
        schema,
        ring_schema,
        sample: std::sync::OnceLock::new(),
        stages: Arc::default(),
        decode,
        tuning,
        cache,
    })
}

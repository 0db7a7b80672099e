//! One thread per ring: it owns the ring's producer, writes what the readers send, and keeps the
//! ring's ledger, from which the daemon tells which rows the trainer has released.
//!
//! # Implementation
//! The producer folds every record the trainer released into the ledger (see
//! [`sluice_ring::ledger`]): the batch's task's consumed end rises to the batch's end before the
//! record's space can be reused. A *survey* folds what is released now, then raises each task's
//! enqueued end to the end of its last published record still unread. The writer surveys when it
//! takes the ring over and whenever the main loop asks before a heartbeat; a full ring folds on its
//! own while the writer waits. Everything the daemon reports is thus read back from the ring and its
//! ledger, which survive the daemon.
//!
//! A ring the daemon gives back (a role was scaled and its trainer stopped) is written no more:
//! the writer drops what it was asked to write, and a write waiting on a full ring with no trainer
//! ends, so the writer surveys the ring a last time and stops.
//!
//! While the daemon's [`Lease`] has lapsed (no call answered by the AM for its length) the writer
//! publishes nothing: it waits before each record until the lease holds again. A batch already
//! waiting for room in a full ring when the lease lapses is the one exception. A ring the daemon
//! fences (the AM declared the node lost and queued its tasks elsewhere) gets an error record in
//! place of what was still to be written, so that its trainer, once it has read what the ring
//! holds, learns why no more comes; the ring stays open for a daemon started again.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use sluice_client::{Encoder, WriteError};
use sluice_proto::NodeId;
use sluice_ring::ledger::{EpochMark, Ledger, LedgerError, LedgerTask};
use sluice_ring::{
    AttachError, FoldError, Producer, RecordKind, RecordMeta, ReserveError, Ring, TryReserveError,
};
use tokio::sync::mpsc;

use crate::feeder::{EpochCount, SourceWait};
use crate::lease::Lease;
use crate::stats::Stages;

/// What a ring's writer is asked to do.
#[derive(Debug)]
pub enum Write {
    /// Rows of a task, covering split rows `[first_row, first_row + row_count)`.
    Batch {
        /// The rows.
        batch: RecordBatch,
        /// Their task.
        task_id: u64,
        /// The split row of the first one.
        first_row: u64,
        /// The split rows covered.
        row_count: u64,
        /// The record's tag: with `data.even_batches`, its epoch and its number in the epoch
        /// ([`crate::feeder::StreamPoint`]); 0 otherwise.
        tag: u64,
    },
    /// Rows of a task the ring leaves out of its epoch (`data.even_batches: drop`): a record the
    /// trainer's reader counts as read and hands out nothing of.
    Dropped {
        /// Their task.
        task_id: u64,
        /// The split row of the first one.
        first_row: u64,
        /// The split rows left out.
        row_count: u64,
    },
    /// The end of an epoch's data, tagged as a batch is.
    EndOfEpoch {
        /// The record's tag.
        tag: u64,
    },
    /// Bring the ledger's consumed and enqueued ends up to date.
    Survey,
}

/// A started ring writer: where to send writes, what it knows of the ring, and its thread.
#[derive(Debug)]
pub struct Started {
    /// Where to send writes; once every sender is dropped the writer ends, closing the ring only
    /// when its stream ended or was given back ([`RingState::end`], [`RingState::give_back`]).
    pub sender: mpsc::Sender<Write>,
    /// The ring's state.
    pub state: Arc<RingState>,
    /// The writer thread.
    pub thread: std::thread::JoinHandle<()>,
}

/// A ring taken over as producer and surveyed, its writer not started yet.
#[derive(Debug)]
pub struct Attached {
    producer: Producer,
    /// The ring's state.
    pub state: Arc<RingState>,
    /// Where the ring's stream stands between epochs: the last batch or end of epoch in it.
    pub mark: EpochMark,
    /// The largest tag of a record in the ring, folded or unread: 0 when none had one.
    pub largest_tag: u64,
}

/// What the daemon knows of one ring: the ring and its ledger.
#[derive(Debug)]
pub struct RingState {
    ring: Ring,
    ledger: Arc<Ledger>,
    failure: Mutex<Option<WriterError>>,
    giving_back: AtomicBool,
    ending: AtomicBool,
    /// Why the ring is fenced, once it is: the message of the error record its trainer gets.
    fence: Mutex<Option<String>>,
    /// How the trainer has been reading.
    reads: Mutex<ReadWatch>,
    /// What the ring's feeder waits for from the sources.
    source_wait: Arc<SourceWait>,
    /// The batches the ring's feeder handed to the writer per epoch.
    counted: Arc<EpochCount>,
}

/// How a ring's trainer has been reading: where its read cursor stood when last looked at, when it
/// last moved, and how far apart its moves came lately.
#[derive(Debug)]
struct ReadWatch {
    cursor: u64,
    moved_at: Option<Instant>,
    interval: Option<Duration>,
}

/// How a ring's trainer reads, for hang detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// How long the trainer has held the ring's records unread (or held) without releasing any,
    /// since it first read: zero while it reads, while the ring is empty, and before its first read.
    pub idle: Duration,
    /// How far apart its read cursor's moves came lately (an average that weighs the recent ones
    /// most), once it moved twice.
    pub interval: Option<Duration>,
}

/// Why a ring's writer could not take its ring over, start, or write.
#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    /// The ring's producer role could not be taken.
    #[error("ring {path}: {error}")]
    Attach {
        /// The ring.
        path: String,
        /// Why.
        error: AttachError,
    },
    /// What the trainer released could not be folded into the ledger.
    #[error("{0}")]
    Fold(FoldError),
    /// The ring's ledger could not be read.
    #[error("{0}")]
    Ledger(LedgerError),
    /// A record could not be written.
    #[error("{0}")]
    Write(WriteError),
    /// The writer's thread could not be started.
    #[error("starting the writer of rank {rank}: {error}")]
    Thread {
        /// The ring's rank.
        rank: u32,
        /// Why.
        error: std::io::Error,
    },
}

/// How long a write waits on a full ring whose trainer is gone before the writer looks whether the
/// ring is being given back; otherwise it waits again, for the trainer's next process.
const GONE_TRAINER_SLICE: Duration = Duration::from_secs(1);

/// How long a write waits in all for a trainer to come back to a full ring before the writer fails.
const GONE_TRAINER_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// How long a fenced ring's writer waits for room for the error record in a ring its trainer does
/// not read; after it the trainer, if it reads again, finds the writer gone instead.
const FENCE_RECORD_WAIT: Duration = Duration::from_secs(10);

impl RingState {
    /// Stops the writer: what it was asked to write is dropped, and it surveys the ring a last
    /// time before it ends.
    pub fn give_back(&self) {
        // Release: pairs with the Acquire load in `RingState::given_back`.
        self.giving_back.store(true, Ordering::Release);
    }

    fn given_back(&self) -> bool {
        // Acquire: pairs with the Release store in `RingState::give_back`.
        self.giving_back.load(Ordering::Acquire)
    }

    /// Marks the stream's end: the job is over, and the writer closes the ring once it has written
    /// what it was given, so that the trainer reads to the end and stops. A writer stopped without
    /// it (the daemon failing) leaves its ring open, as a crash would, for the daemon started
    /// again to take over: a trainer never mistakes a failed daemon for the end of its data.
    pub fn end(&self) {
        // Release: pairs with the Acquire load in `RingState::ending`.
        self.ending.store(true, Ordering::Release);
    }

    fn ending(&self) -> bool {
        // Acquire: pairs with the Release store in `RingState::end`.
        self.ending.load(Ordering::Acquire)
    }

    /// Fences the ring: what the writer was asked to write is dropped, and its trainer gets an
    /// error record with `message` once it has read what the ring holds.
    pub fn fence(&self, message: String) {
        *self
            .fence
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(message);
    }

    fn fence_message(&self) -> Option<String> {
        self.fence
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Notes where the trainer's read cursor stands now; called often (every few milliseconds) so
    /// that the moves' times are close to when they happened.
    pub fn watch_reads(&self) {
        let read = self.read_cursor();
        let mut reads = self
            .reads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if read == reads.cursor {
            return;
        }
        let now = Instant::now();
        if let Some(previous) = reads.moved_at {
            let gap = now.saturating_duration_since(previous);
            reads.interval = Some(match reads.interval {
                None => gap,
                Some(average) => (average * 7 + gap) / 8,
            });
        }
        reads.moved_at = Some(now);
        reads.cursor = read;
    }

    /// The batches the ring's feeder handed to the writer per epoch, shared with the feeder.
    pub fn counted(&self) -> &Arc<EpochCount> {
        &self.counted
    }

    /// What the ring's feeder waits for from the sources, shared with the feeder.
    pub fn source_wait(&self) -> &Arc<SourceWait> {
        &self.source_wait
    }

    /// How the trainer reads, as of the last [`RingState::watch_reads`].
    pub fn reading(&self) -> Reading {
        let (used, _) = self.occupancy();
        let reads = self
            .reads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let idle = match reads.moved_at {
            Some(moved_at) if used > 0 => moved_at.elapsed(),
            _ => Duration::ZERO,
        };
        Reading {
            idle,
            interval: reads.interval,
        }
    }

    /// Whether the writer must write nothing more of the stream: the ring is given back or fenced.
    fn stopping(&self) -> bool {
        self.given_back() || self.fence_message().is_some()
    }

    /// The ring's file, its ledger's and its schema file.
    pub fn files(&self) -> [PathBuf; 3] {
        [
            self.ring.path().to_path_buf(),
            self.ledger.path().to_path_buf(),
            sluice_ring::schema_path_beside(self.ring.path()),
        ]
    }

    /// The ring's ledger: the tasks bound to the ring and their counts.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Binds a task to the ring's ledger, before its feeder gets it: its records count from where
    /// the ring's stream stands now. A record the ring still holds of an earlier binding of the
    /// same task id (a fenced node's, which its trainer reads void) lies before, and counts for
    /// nothing.
    pub fn bind(&self, task: &LedgerTask) -> Result<(), LedgerError> {
        self.ledger.bind(task, self.ring.cursors().0)
    }

    /// The ring's read cursor: the end of what the trainer released.
    pub fn read_cursor(&self) -> u64 {
        self.ring.cursors().1
    }

    /// How long the trainer waited on the ring empty and the writers on it full, summed.
    pub fn waits(&self) -> (Duration, Duration) {
        self.ring.waits()
    }

    /// Bytes written and not yet released, and the ring's capacity.
    pub fn occupancy(&self) -> (u64, u64) {
        let (write, read) = self.ring.cursors();
        (write.saturating_sub(read), self.ring.capacity())
    }

    /// Why the writer stopped, if it failed; taken, so asked again it is `None`.
    pub fn take_failure(&self) -> Option<WriterError> {
        self.failure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }
}

/// Takes the producer role of `ring`, with `ledger` as its fold hook, and surveys the ring: what a
/// producer that died left is folded into the ledger, and its unread records counted as enqueued.
pub fn attach(ring: Ring, ledger: Ledger) -> Result<Attached, WriterError> {
    let mut producer = ring.producer().map_err(|error| WriterError::Attach {
        path: ring.path().display().to_string(),
        error,
    })?;
    let ledger = Arc::new(ledger);
    let hook_ledger = ledger.clone();
    producer.set_fold_hook(move |meta, position| hook_ledger.fold(meta, position));
    let (mark, largest_tag) = survey(&mut producer, &ledger)?;
    let reads = Mutex::new(ReadWatch {
        cursor: ring.cursors().1,
        moved_at: None,
        interval: None,
    });
    let state = Arc::new(RingState {
        reads,
        ring,
        ledger,
        failure: Mutex::new(None),
        giving_back: AtomicBool::new(false),
        ending: AtomicBool::new(false),
        fence: Mutex::new(None),
        source_wait: Arc::default(),
        counted: Arc::default(),
    });
    Ok(Attached {
        producer,
        state,
        mark,
        largest_tag,
    })
}

/// Starts the writer thread of an attached ring; it writes `schema` first (a trainer's reader takes a
/// schema record anywhere in the stream) and stops, closing the ring, once every sender is dropped.
/// `stages` gets the writer's busy and wait times; nothing is published while `lease` has lapsed.
pub(crate) fn start(
    attached: Attached,
    schema: SchemaRef,
    rank: u32,
    stages: Arc<Stages>,
    lease: Arc<Lease>,
) -> Result<Started, WriterError> {
    let Attached {
        producer, state, ..
    } = attached;
    let (sender, receiver) = mpsc::channel(4);
    let thread_state = state.clone();
    let handle = std::thread::Builder::new()
        .name(format!("ring-writer-{rank}"))
        .spawn(move || {
            let written = write_loop(producer, &schema, receiver, &thread_state, &stages, &lease);
            if let Err(error) = written {
                tracing::error!(rank, %error, "ring writer failed");
                *thread_state
                    .failure
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(error);
            }
        })
        .map_err(|error| WriterError::Thread { rank, error })?;
    Ok(Started {
        sender,
        state,
        thread: handle,
    })
}

/// Folds what the trainer released, raises the enqueued end of every task with unread records, and
/// returns the mark of the last batch or end of epoch in the ring and the largest tag of a record
/// in it, folded or unread.
fn survey(producer: &mut Producer, ledger: &Ledger) -> Result<(EpochMark, u64), WriterError> {
    producer.fold().map_err(WriterError::Fold)?;
    let mut mark = ledger.last_folded().map_err(WriterError::Ledger)?;
    let mut largest_tag = ledger.largest_tag();
    producer
        .unread(|meta, position| {
            if matches!(meta.kind, RecordKind::Batch | RecordKind::Dropped) {
                ledger.record_enqueued(meta.task_id, meta.first_row + meta.row_count, position);
            }
            if let Some(unread_mark) = ledger.mark_of(meta, position) {
                mark = unread_mark;
            }
            largest_tag = largest_tag.max(meta.tag);
        })
        .map_err(WriterError::Fold)?;
    Ok((mark, largest_tag))
}

fn write_loop(
    mut producer: Producer,
    schema: &SchemaRef,
    mut receiver: mpsc::Receiver<Write>,
    state: &RingState,
    stages: &Stages,
    lease: &Lease,
) -> Result<(), WriterError> {
    producer.set_peer_timeout(GONE_TRAINER_SLICE);
    if state.ledger.fence_owed() {
        // Before anything of this daemon's: the trainer reads the fenced node's records, then
        // learns that they are void. The ring waits for room as for any record.
        let written = waiting_for_the_trainer(state, || {
            sluice_client::write_error(&mut producer, &fence_message(NodeId(state.ledger.owner())))
                .map(drop)
        })?;
        if !written {
            return Ok(());
        }
        producer.flush();
        state.ledger.fence_written();
    }
    let mut encoder = Encoder::new(schema.clone()).map_err(WriterError::Write)?;
    encoder
        .write_schema_file(state.ring.path())
        .map_err(WriterError::Write)?;
    encoder
        .write_schema(&mut producer)
        .map_err(WriterError::Write)?;
    producer.flush();
    loop {
        let idle = Instant::now();
        let Some(write) = receiver.blocking_recv() else {
            break;
        };
        stages.write.wait(idle.elapsed());
        if state.stopping() {
            break;
        }
        let publishes = !matches!(write, Write::Survey);
        if publishes && !lease.wait(|| state.stopping()) {
            break;
        }
        match write {
            Write::Batch {
                batch,
                task_id,
                first_row,
                row_count,
                tag,
            } => {
                let writing = Instant::now();
                let (full_before, start) = (producer.full_wait(), producer.position());
                let written = waiting_for_the_trainer(state, || {
                    encoder
                        .write_tagged_batch(
                            &mut producer,
                            &batch,
                            task_id,
                            first_row,
                            row_count,
                            tag,
                        )
                        .map(drop)
                })?;
                if !written {
                    break;
                }
                let full = producer.full_wait() - full_before;
                stages.write.wait(full);
                stages.write.busy(writing.elapsed().saturating_sub(full));
                stages.write.out(
                    batch.num_rows(),
                    usize::try_from(producer.position() - start).unwrap_or(usize::MAX),
                );
            }
            Write::Dropped {
                task_id,
                first_row,
                row_count,
            } => {
                let written = waiting_for_the_trainer(state, || {
                    let slot = producer.reserve(0)?;
                    slot.commit(RecordMeta {
                        kind: RecordKind::Dropped,
                        task_id,
                        first_row,
                        row_count,
                        tag: 0,
                    });
                    Ok(())
                })?;
                if !written {
                    break;
                }
            }
            Write::EndOfEpoch { tag } => {
                let written = waiting_for_the_trainer(state, || {
                    let slot = producer.reserve(0)?;
                    slot.commit(RecordMeta::of_kind(RecordKind::EndOfEpoch).tagged(tag));
                    Ok(())
                })?;
                if !written {
                    break;
                }
            }
            Write::Survey => {
                producer.flush();
                survey(&mut producer, &state.ledger)?;
            }
        }
        if receiver.is_empty() {
            producer.flush();
        }
    }
    if state.given_back() {
        producer.flush();
        survey(&mut producer, &state.ledger)?;
    }
    if let Some(message) = state.fence_message() {
        producer.flush();
        if write_fence_record(&mut producer, &message)? {
            state.ledger.fence_written();
        }
        return Ok(());
    }
    if state.ending() || state.given_back() {
        producer.close();
    }
    // Otherwise the producer's drop publishes what was committed and gives the role up, leaving the
    // stream open.
    Ok(())
}

/// What the trainers of a node whose daemon gave up on the AM, after `seconds` without an answer,
/// read at the end of their rings.
pub(crate) fn gave_up_message(node: NodeId, seconds: u64) -> String {
    format!(
        "node {node}'s daemon had no answer from its AM for {seconds} s (--am-timeout-s) and gave \
         up: the AM may have declared the node lost, and then the rows this trainer read since the \
         AM last heard from node {node} are delivered again to other trainers. Drop what was done \
         with them (restore your last checkpoint), and start the trainer again once its sluice \
         daemon runs again",
        node = node.0
    )
}

/// What the trainers of a fenced node read at the end of their rings.
pub(crate) fn fence_message(node: NodeId) -> String {
    format!(
        "node {node} lost its AM for longer than the heartbeat timeout, and the AM declared it lost: \
         the rows this trainer read since the AM last heard from node {node} are delivered again \
         to other trainers. Drop what was done with them (restore your last checkpoint), and start \
         the trainer again once its sluice daemon runs again",
        node = node.0
    )
}

/// Writes the error record of a fenced ring, waiting up to [`FENCE_RECORD_WAIT`] for room;
/// returns whether it is written. One not written stays owed in the ledger, for the daemon started
/// again to write first.
fn write_fence_record(producer: &mut Producer, message: &str) -> Result<bool, WriterError> {
    let started = Instant::now();
    loop {
        match producer.try_reserve(message.len()) {
            Ok(mut slot) => {
                slot.payload_mut().copy_from_slice(message.as_bytes());
                slot.commit(RecordMeta::of_kind(RecordKind::Error));
                producer.flush();
                return Ok(true);
            }
            Err(TryReserveError::Full) if started.elapsed() < FENCE_RECORD_WAIT => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(TryReserveError::Full) => {
                tracing::warn!(
                    "a fenced ring stayed full: the daemon started again writes its error record first"
                );
                return Ok(false);
            }
            Err(TryReserveError::TooLarge { path, max, .. }) => {
                tracing::warn!(
                    ring = %path.display(),
                    max,
                    "a fenced ring is too small for its error record"
                );
                return Ok(false);
            }
            Err(TryReserveError::Fold(error)) => return Err(WriterError::Fold(error)),
        }
    }
}

/// Runs `write` until it is done, trying again while the ring is full and its trainer gone (a
/// trainer being restarted), up to [`GONE_TRAINER_TIMEOUT`]; returns `false`, with nothing written,
/// once the ring is being given back.
fn waiting_for_the_trainer(
    state: &RingState,
    mut write: impl FnMut() -> Result<(), WriteError>,
) -> Result<bool, WriterError> {
    let started = Instant::now();
    loop {
        match write() {
            Ok(()) => return Ok(true),
            Err(WriteError::Reserve(ReserveError::ConsumerGone { .. })) if state.given_back() => {
                return Ok(false);
            }
            Err(WriteError::Reserve(ReserveError::ConsumerGone { .. }))
                if started.elapsed() < GONE_TRAINER_TIMEOUT => {}
            Err(error) => return Err(WriterError::Write(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{DataType, Field, Schema};
    use sluice_ring::RingOptions;

    /// A writer on a new ring under `directory`, and the ring as its trainer sees it.
    fn writer(directory: &std::path::Path) -> (Started, Ring) {
        writer_under(directory, Arc::new(Lease::new()))
    }

    /// A writer on a new ring under `directory` that publishes while `lease` holds.
    fn writer_under(directory: &std::path::Path, lease: Arc<Lease>) -> (Started, Ring) {
        let path = directory.join("0.ring");
        let ring = RingOptions::new(&path)
            .capacity(1 << 16)
            .create()
            .expect("ring");
        let ledger = Ledger::create(Ledger::path_beside(&path), 1).expect("ledger");
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let attached = attach(ring, ledger).expect("attach");
        let started =
            start(attached, schema, 0, Arc::new(Stages::default()), lease).expect("start");
        (started, Ring::open(&path).expect("the trainer's view"))
    }

    #[test]
    fn a_writer_closes_its_ring_only_when_the_stream_ends() {
        let directory = tempfile::tempdir().expect("tempdir");
        // The daemon failing: its writers stop with no end, as a crash would leave them.
        let (abandoned, trainer_view) = writer(directory.path());
        drop(abandoned.sender);
        abandoned.thread.join().expect("the writer ends");
        assert!(
            !trainer_view.is_closed(),
            "a failed daemon must not look like the end of the data"
        );

        let other = tempfile::tempdir().expect("tempdir");
        let (ended, trainer_view) = writer(other.path());
        ended.state.end();
        drop(ended.sender);
        ended.thread.join().expect("the writer ends");
        assert!(trainer_view.is_closed(), "the job over: the stream ends");
    }

    /// One batch of `rows` ids for task 1.
    fn batch(rows: i64) -> Write {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let ids = arrow::array::Int64Array::from_iter_values(0..rows);
        Write::Batch {
            batch: RecordBatch::try_new(schema, vec![Arc::new(ids)]).expect("batch"),
            task_id: 1,
            first_row: 0,
            row_count: rows as u64,
            tag: 0,
        }
    }

    #[test]
    fn a_writer_publishes_nothing_while_the_lease_has_lapsed() {
        let directory = tempfile::tempdir().expect("tempdir");
        let lease = Arc::new(Lease::new());
        lease.set_length(Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(20));
        let (started, trainer_view) = writer_under(directory.path(), lease.clone());
        let schema_written = Instant::now() + Duration::from_secs(5);
        while trainer_view.cursors().0 == 0 {
            assert!(Instant::now() < schema_written, "the schema is written");
            std::thread::sleep(Duration::from_millis(1));
        }
        let with_schema = trainer_view.cursors().0;
        started.sender.blocking_send(batch(100)).expect("send");
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            trainer_view.cursors().0,
            with_schema,
            "a batch was published with the lease lapsed"
        );
        lease.renew(Instant::now());
        lease.set_length(Duration::from_secs(60));
        let published = Instant::now() + Duration::from_secs(5);
        while trainer_view.cursors().0 == with_schema {
            assert!(
                Instant::now() < published,
                "the lease renewed, the batch goes out"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        started.state.end();
        drop(started.sender);
        started.thread.join().expect("the writer ends");
    }

    /// A daemon that takes a ring over finds the largest tag in it, of the records its trainer
    /// released (through the ledger) and of those still unread.
    #[test]
    fn a_ring_taken_over_gives_the_largest_tag_released_or_unread() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("0.ring");
        let (started, trainer_view) = writer(directory.path());
        let tagged = |rows, tag| match batch(rows) {
            Write::Batch {
                batch,
                task_id,
                first_row,
                row_count,
                ..
            } => Write::Batch {
                batch,
                task_id,
                first_row,
                row_count,
                tag,
            },
            other => other,
        };
        for (rows, tag) in [(10, 7), (10, 9)] {
            started
                .sender
                .blocking_send(tagged(rows, tag))
                .expect("send");
        }
        started
            .sender
            .blocking_send(Write::EndOfEpoch { tag: 11 })
            .expect("send");
        // The daemon dies: its writer ends with no end of stream.
        drop(started.sender);
        started.thread.join().expect("the writer ends");
        let mut consumer = trainer_view.consumer().expect("consumer");
        let mut tags = Vec::new();
        for _ in 0..3 {
            let record = consumer.next().expect("read").expect("a record");
            tags.push(record.meta().tag);
            record.release();
        }
        assert_eq!(tags, [0, 7, 9], "the schema has no tag");
        let taken_over = || {
            let ring = Ring::open(&path).expect("ring");
            let ledger = Ledger::open(Ledger::path_beside(&path)).expect("ledger");
            let attached = attach(ring, ledger).expect("attach");
            attached.largest_tag
        };
        assert_eq!(taken_over(), 11, "the end of epoch, unread");
        let record = consumer.next().expect("read").expect("the end of epoch");
        record.release();
        assert_eq!(taken_over(), 11, "the end of epoch, released and folded");
    }

    /// The ring's trainer reads every item up to the end of what is published, releasing each;
    /// returns the batches' row counts and the errors' messages, in order.
    fn read_all(trainer_view: &Ring, items: usize) -> Vec<Result<u64, String>> {
        let mut reader = sluice_client::Reader::new(trainer_view.consumer().expect("consumer"));
        (0..items)
            .map(|_| match reader.next_item() {
                Ok(Some(sluice_client::Item::Batch { row_count, .. })) => Ok(row_count),
                Err(sluice_client::ReadError::Producer(message)) => Err(message),
                other => panic!("expected a batch or an error, got {other:?}"),
            })
            .collect()
    }

    /// The AM declared the node lost while its ring held rows 0..10 of task 1, and its daemon died
    /// before it heard: the daemon that takes the ring over is fenced at its registration, and
    /// the AM hands task 1 back from row 0. The trainer reads the void copy, then the fence's
    /// error, then the new rows; only the new rows count for the task.
    #[test]
    fn a_fence_owed_comes_before_the_new_rows_and_void_copies_count_for_nothing() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("0.ring");
        let task = LedgerTask {
            task_id: 1,
            epoch: 0,
            start: 0,
            end: 100,
            consumed_end: 0,
            enqueued_end: 0,
        };
        let (fenced, trainer_view) = writer(directory.path());
        fenced.state.bind(&task).expect("bind");
        fenced.sender.blocking_send(batch(10)).expect("send");
        drop(fenced.sender);
        fenced.thread.join().expect("the writer ends");

        let ring = Ring::open(&path).expect("ring");
        let ledger = Ledger::open(Ledger::path_beside(&path)).expect("ledger");
        let attached = attach(ring, ledger).expect("attach");
        attached.state.ledger().owe_fence();
        attached.state.ledger().clear();
        attached.state.bind(&task).expect("bound again");
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let successor = start(
            attached,
            schema,
            0,
            Arc::new(Stages::default()),
            Arc::new(Lease::new()),
        )
        .expect("start");
        successor.sender.blocking_send(batch(5)).expect("send");
        let items = read_all(&trainer_view, 3);
        assert_eq!(items[0], Ok(10), "the void copy");
        assert!(
            items[1].as_ref().is_err_and(
                |message| message.contains("node 1") && message.contains("delivered again")
            ),
            "then the fence's error: {items:?}"
        );
        assert_eq!(items[2], Ok(5), "then the new rows");
        let ledger = successor.state.ledger();
        assert!(!ledger.fence_owed(), "the record is written");
        let folded = Instant::now() + Duration::from_secs(10);
        loop {
            successor
                .sender
                .blocking_send(Write::Survey)
                .expect("survey");
            let bound = ledger.task(1).expect("bound");
            if bound.consumed_end > 0 {
                assert_eq!(
                    (bound.consumed_end, bound.enqueued_end),
                    (5, 5),
                    "only the new rows count"
                );
                break;
            }
            assert!(Instant::now() < folded, "the releases are folded");
            std::thread::yield_now();
        }
        successor.state.end();
        drop(successor.sender);
        successor.thread.join().expect("the writer ends");
    }

    #[test]
    fn a_fenced_ring_ends_with_the_fence_error_and_stays_open() {
        let directory = tempfile::tempdir().expect("tempdir");
        let (started, trainer_view) = writer(directory.path());
        started.state.fence("node 3 lost its AM".to_owned());
        drop(started.sender);
        started.thread.join().expect("the writer ends");
        assert!(!trainer_view.is_closed(), "a fenced ring stays open");
        let mut reader = sluice_client::Reader::new(trainer_view.consumer().expect("consumer"));
        match reader.next_item() {
            Err(sluice_client::ReadError::Producer(message)) => {
                assert_eq!(message, "node 3 lost its AM")
            }
            other => panic!("expected the fence's error, got {other:?}"),
        }
    }
}

//! The group-committing writer: the pending queue that appends fill, and the background task that
//! makes each batch durable with one write.

use std::collections::VecDeque;
use std::fs::File;
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use super::error::{JournalError, Result};
use super::frame::{self, MAX_FRAME_PAYLOAD, RecordKind, SEGMENT_MAGIC};
use super::recover::Listing;
use super::store::{
    Created, LocalStore, OpenRecord, SHORTAGE_RETRY_INTERVAL, SHORTAGE_TRIES_PER_WARNING, Store,
    blocking, segment_name, snapshot_name,
};

/// A handle that resolves once an append or snapshot is durable, or with the error that kept it
/// from being so.
#[must_use = "an append is durable only once its Durable resolves"]
#[derive(Debug)]
pub struct Durable {
    state: DurableState,
}

#[derive(Debug)]
enum DurableState {
    Waiting {
        receiver: oneshot::Receiver<Result<()>>,
        uri: Arc<str>,
    },
    Ready(Option<JournalError>),
    Done,
}

impl Durable {
    fn waiting(receiver: oneshot::Receiver<Result<()>>, uri: Arc<str>) -> Durable {
        Durable {
            state: DurableState::Waiting { receiver, uri },
        }
    }

    pub(super) fn failed(error: JournalError) -> Durable {
        Durable {
            state: DurableState::Ready(Some(error)),
        }
    }
}

impl Future for Durable {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        match &mut this.state {
            DurableState::Waiting { receiver, uri } => match Pin::new(receiver).poll(context) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(outcome) => {
                    let outcome = outcome.unwrap_or_else(|_| {
                        Err(JournalError::WriterStopped {
                            uri: uri.to_string(),
                        })
                    });
                    this.state = DurableState::Done;
                    Poll::Ready(outcome)
                }
            },
            DurableState::Ready(error) => {
                let error = error
                    .take()
                    .expect("a failed Durable holds its error until polled");
                this.state = DurableState::Done;
                Poll::Ready(Err(error))
            }
            DurableState::Done => panic!("Durable polled after it resolved"),
        }
    }
}

/// Counts of what the writer made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JournalStats {
    /// Writes to storage: segment appends or objects (each followed by `fdatasync` locally).
    pub writes: u64,
    /// Entries made durable.
    pub entries: u64,
    /// Bytes of frames made durable.
    pub bytes: u64,
    /// Snapshots made durable.
    pub snapshots: u64,
}

/// Statistics counters. Relaxed throughout: they are read for reports only, and no other memory is
/// published through them.
#[derive(Debug, Default)]
struct Counters {
    writes: AtomicU64,
    entries: AtomicU64,
    bytes: AtomicU64,
    snapshots: AtomicU64,
}

/// How far a journal is written: see [`Journal::mark`](super::Journal::mark).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// The sequence this writer claimed when it opened the journal: a later writer claims a
    /// larger one.
    pub generation: u64,
    /// The end of the records appended so far.
    pub appended: u64,
    /// The end of the records that are durable: every record before it is.
    pub durable: u64,
}

/// The state appenders and the writer task share.
#[derive(Debug)]
pub(super) struct Shared {
    uri: Arc<str>,
    /// The sequence of the open record this writer claimed.
    generation: u64,
    /// The end of the records made durable. Stored before the waiters of a batch are told, so
    /// that an appender woken by its batch reads a mark that covers it.
    durable: AtomicU64,
    queue: Mutex<Queue>,
    /// Wakes the writer task when an op is queued or the journal closes.
    wake: Notify,
    counters: Counters,
}

#[derive(Debug)]
struct Queue {
    /// The sequence the next record gets.
    next_sequence: u64,
    ops: VecDeque<Op>,
    /// Set once a write failed: every later append fails with it.
    failure: Option<JournalError>,
    closing: bool,
}

/// Encodes a snapshot captured when it was queued into a buffer from [`frame::snapshot_buffer`].
/// It runs on the snapshot's own thread at idle priority, so that the appender's lock is not held
/// while a large state is encoded, and the threads that answer the daemons come first.
pub(super) type SnapshotEncoder = Box<dyn FnOnce() -> Result<Vec<u8>> + Send>;

/// Work for the writer task, in sequence order.
enum Op {
    /// Consecutive records, written with one write.
    Records(Batch),
    /// A snapshot of everything before `sequence`.
    Snapshot(SnapshotJob),
}

impl std::fmt::Debug for Op {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Records(batch) => formatter.debug_tuple("Records").field(batch).finish(),
            Op::Snapshot(job) => formatter
                .debug_struct("Snapshot")
                .field("sequence", &job.sequence)
                .finish_non_exhaustive(),
        }
    }
}

#[derive(Debug)]
struct Batch {
    first: u64,
    /// [`SEGMENT_MAGIC`] followed by the frames: an object as it is put on object stores.
    content: Vec<u8>,
    waiters: Vec<oneshot::Sender<Result<()>>>,
}

impl Shared {
    /// The shared state of the writer that claimed `generation`, whose open record is durable.
    pub fn new(uri: &str, generation: u64) -> Shared {
        let next_sequence = generation + 1;
        Shared {
            uri: Arc::from(uri),
            generation,
            durable: AtomicU64::new(next_sequence),
            queue: Mutex::new(Queue {
                next_sequence,
                ops: VecDeque::new(),
                failure: None,
                closing: false,
            }),
            wake: Notify::new(),
            counters: Counters::default(),
        }
    }

    pub fn uri(&self) -> &str {
        &self.uri
    }

    pub fn uri_arc(&self) -> &Arc<str> {
        &self.uri
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The queue's invariants hold between statements that cannot panic; a panic elsewhere
        // while it was held leaves it usable.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues one record after every earlier one, joining the batch being filled.
    pub fn append(&self, body: &[u8]) -> Durable {
        if body.len() >= MAX_FRAME_PAYLOAD {
            return Durable::failed(JournalError::Encode {
                uri: self.uri.to_string(),
                what: "an entry",
                reason: format!(
                    "it is {} bytes, the limit is {MAX_FRAME_PAYLOAD}; keep large state in snapshots",
                    body.len()
                ),
            });
        }
        let (sender, receiver) = oneshot::channel();
        {
            let mut queue = self.lock();
            if let Some(failure) = &queue.failure {
                return Durable::failed(failure.clone());
            }
            let sequence = queue.next_sequence;
            queue.next_sequence += 1;
            let batch = match queue.ops.back_mut() {
                Some(Op::Records(batch)) => batch,
                _ => {
                    queue.ops.push_back(Op::Records(Batch {
                        first: sequence,
                        content: SEGMENT_MAGIC.to_vec(),
                        waiters: Vec::new(),
                    }));
                    match queue.ops.back_mut() {
                        Some(Op::Records(batch)) => batch,
                        _ => unreachable!("a batch was just pushed"),
                    }
                }
            };
            debug_assert_eq!(batch.first + batch.waiters.len() as u64, sequence);
            frame::push_frame(&mut batch.content, RecordKind::Entry, body);
            batch.waiters.push(sender);
        }
        self.wake.notify_one();
        Durable::waiting(receiver, Arc::clone(&self.uri))
    }

    /// Queues a snapshot of everything appended so far. `encode` is called later, on the snapshot
    /// task's blocking thread; what it encodes must be the state as of this call.
    pub fn snapshot(&self, encode: SnapshotEncoder) -> Durable {
        let (waiter, receiver) = oneshot::channel();
        {
            let mut queue = self.lock();
            if let Some(failure) = &queue.failure {
                return Durable::failed(failure.clone());
            }
            let sequence = queue.next_sequence;
            queue.ops.push_back(Op::Snapshot(SnapshotJob {
                sequence,
                encode,
                waiter,
            }));
        }
        self.wake.notify_one();
        Durable::waiting(receiver, Arc::clone(&self.uri))
    }

    /// Lets the writer finish what is queued, then stop.
    pub fn close(&self) {
        self.lock().closing = true;
        self.wake.notify_one();
    }

    /// How far the journal is written now.
    pub fn mark(&self) -> Mark {
        let appended = self.lock().next_sequence;
        Mark {
            generation: self.generation,
            appended,
            durable: self.durable.load(Ordering::Acquire),
        }
    }

    pub fn stats(&self) -> JournalStats {
        JournalStats {
            writes: self.counters.writes.load(Ordering::Relaxed),
            entries: self.counters.entries.load(Ordering::Relaxed),
            bytes: self.counters.bytes.load(Ordering::Relaxed),
            snapshots: self.counters.snapshots.load(Ordering::Relaxed),
        }
    }

    /// Takes the next op, waiting for one; `None` once the journal is closing and nothing is left.
    async fn next_op(&self) -> Option<Op> {
        loop {
            {
                let mut queue = self.lock();
                if let Some(op) = queue.ops.pop_front() {
                    return Some(op);
                }
                if queue.closing {
                    return None;
                }
            }
            // A notify_one between the check above and this await stores a permit, which this
            // await takes: no wake-up is lost.
            self.wake.notified().await;
        }
    }

    /// Why the writer stopped, once it did: every later append fails with it.
    pub(super) fn failure(&self) -> Option<JournalError> {
        self.lock().failure.clone()
    }

    /// Records a write failure: fails every queued op and every later append with it.
    fn fail(&self, error: &JournalError) {
        let ops = {
            let mut queue = self.lock();
            queue.failure = Some(error.clone());
            std::mem::take(&mut queue.ops)
        };
        for op in ops {
            match op {
                Op::Records(batch) => settle(batch.waiters, &Err(error.clone())),
                Op::Snapshot(job) => {
                    // The appender may have dropped its Durable; nothing waits then.
                    let _ = job.waiter.send(Err(error.clone()));
                }
            }
        }
    }
}

fn settle(waiters: Vec<oneshot::Sender<Result<()>>>, outcome: &Result<()>) {
    for waiter in waiters {
        // The appender may have dropped its Durable; nothing waits then.
        let _ = waiter.send(outcome.clone());
    }
}

/// The writer task: takes ops in order and makes each batch durable. Stops at the first failed
/// batch, which every later append then reports. Snapshots go to their own task, so that a large
/// snapshot does not hold up the batches behind it.
///
/// Two writes start at least `write_interval` apart: appends made meanwhile wait and join the next
/// write.
pub(super) async fn run(
    shared: Arc<Shared>,
    mut sink: Sink,
    write_interval: Duration,
) -> Result<()> {
    let _stopped = FailWhenStopped(&shared);
    let (snapshot_jobs, snapshot_queue) = mpsc::unbounded_channel();
    let snapshots = tokio::spawn(write_snapshots(
        Arc::clone(&shared),
        sink.snapshot_writer(),
        snapshot_queue,
    ));
    let mut next_write = Instant::now();
    let outcome = loop {
        if Instant::now() < next_write {
            tokio::time::sleep_until(next_write).await;
        }
        let Some(op) = shared.next_op().await else {
            break Ok(());
        };
        match op {
            Op::Records(batch) => {
                next_write = Instant::now() + write_interval;
                let entries = batch.waiters.len() as u64;
                let bytes = (batch.content.len() - SEGMENT_MAGIC.len()) as u64;
                let outcome = sink.commit(batch.first, batch.content).await;
                if outcome.is_ok() {
                    shared
                        .durable
                        .store(batch.first + entries, Ordering::Release);
                    shared.counters.writes.fetch_add(1, Ordering::Relaxed);
                    shared
                        .counters
                        .entries
                        .fetch_add(entries, Ordering::Relaxed);
                    shared.counters.bytes.fetch_add(bytes, Ordering::Relaxed);
                }
                settle(batch.waiters, &outcome);
                if let Err(error) = outcome {
                    break Err(error);
                }
            }
            Op::Snapshot(job) => {
                // Every record before the snapshot's sequence is durable: the snapshot can be
                // encoded and written while later batches go on, into a new segment (so that
                // compaction can delete the old).
                sink.start_new_segment();
                if let Err(job) = snapshot_jobs.send(job) {
                    let error = JournalError::WriterStopped {
                        uri: shared.uri().to_string(),
                    };
                    let _ = job.0.waiter.send(Err(error.clone()));
                    break Err(error);
                }
            }
        }
    };
    if let Err(error) = &outcome {
        tracing::error!(uri = shared.uri(), %error, "journal writer stopped");
        shared.fail(error);
    }
    drop(snapshot_jobs);
    match snapshots.await {
        Ok(()) => {}
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(_) => {
            return Err(JournalError::WriterStopped {
                uri: shared.uri().to_string(),
            });
        }
    }
    outcome
}

/// Fails whatever is still queued when the writer task ends for any reason (a panic in a write, the
/// runtime shutting down), so that no appender waits forever.
struct FailWhenStopped<'a>(&'a Shared);

impl Drop for FailWhenStopped<'_> {
    fn drop(&mut self) {
        if self.0.lock().failure.is_none() {
            self.0.fail(&JournalError::WriterStopped {
                uri: self.0.uri().to_string(),
            });
        }
    }
}

/// A snapshot queued by an appender, handed from the writer task to the snapshot task.
struct SnapshotJob {
    sequence: u64,
    encode: SnapshotEncoder,
    waiter: oneshot::Sender<Result<()>>,
}

/// The snapshot task: encodes and writes snapshots in order, then deletes what each replaces. A failed snapshot
/// leaves the journal as it was (the entries it would replace stay); only a fence stops the journal.
async fn write_snapshots(
    shared: Arc<Shared>,
    writer: SnapshotWriter,
    mut jobs: mpsc::UnboundedReceiver<SnapshotJob>,
) {
    while let Some(job) = jobs.recv().await {
        let outcome = writer.write(job.sequence, job.encode).await;
        // The appender may have dropped its Durable; nothing waits then.
        let _ = job.waiter.send(outcome.clone());
        let outcome = match outcome {
            Ok(()) => {
                shared.counters.snapshots.fetch_add(1, Ordering::Relaxed);
                writer.compact(job.sequence).await
            }
            Err(error) => Err(error),
        };
        match outcome {
            Ok(()) => {}
            Err(error @ JournalError::Fenced { .. }) => {
                tracing::error!(uri = shared.uri(), %error, "journal writer stopped");
                shared.fail(&error);
                return;
            }
            Err(error) => {
                tracing::warn!(uri = shared.uri(), %error, "a journal snapshot failed; the entries it would replace stay");
            }
        }
    }
}

/// Runs `work` on a thread of its own at idle priority (see
/// [`sluice_process::make_current_thread_idle_priority`]): encoding the snapshot of a large job
/// takes a core for a second or more, and writing it to a local file copies it again into the page
/// cache; the threads that answer the daemons come first. It still runs at once on a core nothing
/// else wants.
async fn in_background<T: Send + 'static>(
    uri: &str,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let (sender, receiver) = oneshot::channel();
    let thread_uri = uri.to_string();
    std::thread::Builder::new()
        .name("sluice-snapshot".into())
        .spawn(move || {
            if let Err(error) = sluice_process::make_current_thread_idle_priority() {
                tracing::debug!(uri = thread_uri, %error, "writing a snapshot at normal priority");
            }
            // The writer may have stopped meanwhile; nothing waits then.
            let _ = sender.send(work());
        })
        .map_err(|error| JournalError::io(uri, "starting the snapshot thread", error))?;
    receiver.await.map_err(|_| JournalError::WriterStopped {
        uri: uri.to_string(),
    })?
}

/// A local writer's generation, checked before it acknowledges anything or deletes anything.
#[derive(Debug, Clone)]
pub(super) struct Fence {
    pub local: Arc<LocalStore>,
    pub generation: u64,
}

impl Fence {
    /// Fails with [`JournalError::Fenced`] when a newer writer has taken the next generation.
    fn check(&self, uri: &str) -> Result<()> {
        match self.local.fenced_by(self.generation)? {
            Some(by) => Err(JournalError::Fenced {
                uri: uri.to_string(),
                by,
            }),
            None => Ok(()),
        }
    }
}

/// Where the writer task writes batches.
#[derive(Debug)]
pub(super) struct Sink {
    store: Store,
    target: Target,
}

#[derive(Debug)]
enum Target {
    /// A local directory: batches are appended to the open segment file.
    Local {
        fence: Fence,
        /// The open segment and its name; `None` when the next batch starts a new segment.
        segment: Option<(Arc<File>, String)>,
    },
    /// An object store: every batch is a new object.
    Object,
}

impl Sink {
    /// A local writer that appends to `segment`, the file it claimed.
    pub fn local(store: Store, fence: Fence, segment: File, name: String) -> Sink {
        Sink {
            store,
            target: Target::Local {
                fence,
                segment: Some((Arc::new(segment), name)),
            },
        }
    }

    /// An object-store writer.
    pub fn object(store: Store) -> Sink {
        Sink {
            store,
            target: Target::Object,
        }
    }

    fn snapshot_writer(&self) -> SnapshotWriter {
        SnapshotWriter {
            store: self.store.clone(),
            fence: match &self.target {
                Target::Local { fence, .. } => Some(fence.clone()),
                Target::Object => None,
            },
        }
    }

    /// Makes the next batch start a new segment.
    fn start_new_segment(&mut self) {
        if let Target::Local { segment, .. } = &mut self.target {
            *segment = None;
        }
    }

    /// Makes one batch durable: `content` is [`SEGMENT_MAGIC`] and the frames of records
    /// `first, first + 1, ...`.
    async fn commit(&mut self, first: u64, content: Vec<u8>) -> Result<()> {
        let store = &self.store;
        match &mut self.target {
            Target::Local { fence, segment } => {
                let uri = store.uri().to_string();
                let fence = fence.clone();
                let open = segment.clone();
                let created = blocking(store.uri(), move || {
                    let created = match open {
                        Some((file, name)) => {
                            (&*file)
                                .write_all(&content[SEGMENT_MAGIC.len()..])
                                .and_then(|()| file.sync_data())
                                .map_err(|error| {
                                    JournalError::io(&format!("{uri}/{name}"), "appending", error)
                                })?;
                            None
                        }
                        None => {
                            let name = segment_name(first);
                            match fence.local.create(&name, &content)? {
                                Created::Created(file) => Some((Arc::new(file), name)),
                                Created::Exists => {
                                    fence.check(&uri)?;
                                    return Err(JournalError::Fenced {
                                        by: format!("a writer that created {uri}/{name}"),
                                        uri,
                                    });
                                }
                            }
                        }
                    };
                    // The write is durable; it counts only if no newer writer had fenced this one
                    // before. A newer writer takes its generation before it reads the journal, so
                    // a write that passes this check was complete before that read began.
                    fence.check(&uri)?;
                    Ok(created)
                })
                .await?;
                if let Some(created) = created {
                    *segment = Some(created);
                }
                Ok(())
            }
            Target::Object => {
                let name = segment_name(first);
                let content = Bytes::from(content);
                // A create that failed for want of a descriptor is tried again: one that landed
                // all the same is found below as this very batch.
                let mut tries: u64 = 0;
                let created = loop {
                    match store.create(&name, content.clone()).await {
                        Err(error) if error.is_descriptor_shortage() => {
                            if tries.is_multiple_of(SHORTAGE_TRIES_PER_WARNING) {
                                tracing::warn!(%error, tries, "the journal waits for a file descriptor and tries again; close idle connections to the AM or raise its limit of open files (ulimit -n)");
                            }
                            tries += 1;
                            tokio::time::sleep(SHORTAGE_RETRY_INTERVAL).await;
                        }
                        outcome => break outcome?,
                    }
                };
                match created {
                    Created::Created(()) => Ok(()),
                    Created::Exists => {
                        let stored = store.read(&name).await?;
                        if stored.as_ref() == Some(&content) {
                            // A retried put of this very batch that had landed the first time.
                            return Ok(());
                        }
                        Err(JournalError::Fenced {
                            uri: store.uri().to_string(),
                            by: stored
                                .as_deref()
                                .and_then(opener)
                                .map(|record| record.describe())
                                .unwrap_or_else(|| {
                                    format!("a writer that created {}", store.object_uri(&name))
                                }),
                        })
                    }
                }
            }
        }
    }
}

/// Writes snapshots and deletes what they replace.
#[derive(Debug)]
struct SnapshotWriter {
    store: Store,
    fence: Option<Fence>,
}

impl SnapshotWriter {
    /// Encodes a snapshot and makes it durable under `snapshot/<sequence>.snap`. In a local
    /// directory the file is written on the thread that encodes it, at idle priority too.
    async fn write(&self, sequence: u64, encode: SnapshotEncoder) -> Result<()> {
        let name = snapshot_name(sequence);
        let sealed = move || {
            let mut buffer = encode()?;
            frame::seal_snapshot(&mut buffer, sequence);
            Ok(buffer)
        };
        let created = match &self.store {
            Store::Local(local) => {
                let local = Arc::clone(local);
                let name = name.clone();
                in_background(self.store.uri(), move || {
                    Ok(match local.create(&name, &sealed()?)? {
                        Created::Created(_) => Created::Created(()),
                        Created::Exists => Created::Exists,
                    })
                })
                .await?
            }
            Store::Object(_) => {
                let content = in_background(self.store.uri(), sealed).await?;
                self.store.create(&name, Bytes::from(content)).await?
            }
        };
        // An existing snapshot of the same sequence is one this journal's history already made
        // durable: a snapshot is only written once every record before it is durable, so every
        // snapshot of a sequence holds the same state.
        if let Created::Exists = created {
            tracing::debug!(object = %self.store.object_uri(&name), "the snapshot was already durable");
        }
        Ok(())
    }

    /// Deletes the segments and snapshots that the snapshot at `sequence` replaces. Only a fence
    /// is an error: failing to delete is logged, as the objects are only dead weight and the next
    /// snapshot deletes them.
    async fn compact(&self, sequence: u64) -> Result<()> {
        if let Some(fence) = &self.fence {
            let fence = fence.clone();
            let uri = self.store.uri().to_string();
            blocking(self.store.uri(), move || fence.check(&uri)).await?;
        }
        let store = &self.store;
        let deleted = async {
            let listing = Listing::read(store).await?;
            let mut names: Vec<String> = listing
                .segments
                .windows(2)
                .filter(|pair| pair[1] <= sequence)
                .map(|pair| segment_name(pair[0]))
                .collect();
            names.extend(
                listing
                    .snapshots
                    .iter()
                    .filter(|&&snapshot| snapshot < sequence)
                    .map(|&snapshot| snapshot_name(snapshot)),
            );
            let count = names.len();
            store.delete(names).await.map(|()| count)
        };
        match deleted.await {
            Ok(count) => {
                tracing::debug!(uri = store.uri(), sequence, count, "compacted the journal")
            }
            Err(error) => {
                tracing::warn!(uri = store.uri(), sequence, %error, "compacting the journal failed; the next snapshot retries")
            }
        }
        Ok(())
    }
}

/// The writer that opened the journal in this segment, when it starts with an open record.
fn opener(segment: &[u8]) -> Option<OpenRecord> {
    let parsed = frame::parse_segment(segment, Some(1)).ok()?;
    let first = parsed.frames.first()?;
    if first.kind != RecordKind::Open {
        return None;
    }
    postcard::from_bytes(first.body).ok()
}

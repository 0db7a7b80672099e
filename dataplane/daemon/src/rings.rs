//! The rings a daemon owns, one per trainer rank it feeds: opened or taken over from their ledgers
//! after a restart, written by their writers and fed by their feeders, surveyed for the counts the
//! daemon reports, stopped, and given back.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sluice_proto::{NodeId, TaskId, v1};
use sluice_ring::files::{self, Sharing};
use sluice_ring::ledger::{EpochMark, LEDGER_EXTENSION, Ledger, LedgerTask};
use sluice_ring::{RING_EXTENSION, Ring, RingOptions};
use tokio::sync::{mpsc, watch};

use crate::book::{Counts, Freed, LedgerWrite};
use crate::error::{DaemonError, Result};
use crate::feeder::{HOLD_CAP, Job, LocalFloor, Pipeline, RingFeed, Settled, StreamPoint, feed};
use crate::lease::Lease;
use crate::writer::{self, Attached, RingState, Write};

/// One rank's ring: its feeder's queue, the writer's state and thread.
#[derive(Debug)]
struct RankRing {
    rank: u32,
    /// The batches its feeder holds back (`data.even_batches: drop`).
    held: Arc<AtomicUsize>,
    queue: mpsc::UnboundedSender<Job>,
    /// The writer's queue, for surveys.
    writer: mpsc::Sender<Write>,
    state: Arc<RingState>,
    /// The read cursor at the last survey sent to the writer.
    surveyed_read: u64,
    feeder: tokio::task::JoinHandle<()>,
    writer_thread: std::thread::JoinHandle<()>,
}

/// The rings of the ranks a registration names, in the order of the ranks: a ring's index is its
/// place in that order.
#[derive(Debug)]
pub(crate) struct Rings {
    rings: Vec<RankRing>,
    /// The counts of `data.even_batches` the AM settled, for the feeders.
    settled: Arc<watch::Sender<Settled>>,
}

impl Rings {
    /// Opens the ring of every rank under `job_dir`, taking over the ones `recovered` holds, and
    /// starts its writer, which publishes while `lease` holds, and its feeder. A ring opened empty
    /// starts in `current_epoch`, the job's, so that it ends every epoch it gets no task in. With
    /// `data.even_batches: drop` and every one of the job's `world_size` ranks here, the feeders
    /// allow one another the fewest batches any of them made at once ([`LocalFloor`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open(
        job_dir: &Path,
        ranks: &[u32],
        world_size: u32,
        ring_size: u64,
        node: NodeId,
        recovered: &mut Recovered,
        pipeline: &Arc<Pipeline>,
        lease: &Arc<Lease>,
        current_epoch: u32,
    ) -> Result<Rings> {
        let mut started_rings = Vec::new();
        let (settled, told) = watch::channel(Settled::default());
        let settled = Arc::new(settled);
        for rank in ranks {
            let attached = match recovered.rings.remove(rank) {
                Some(attached) => attached,
                None => {
                    let (ring, ledger) = open_ring(job_dir, *rank, ring_size, node.0)?;
                    writer::attach(ring, ledger).map_err(DaemonError::Writer)?
                }
            };
            let epoch = resumed_epoch(
                attached.mark,
                attached.largest_tag,
                pipeline.shape.even,
                current_epoch,
            );
            // With `data.even_batches`, a ring taken over continues its epoch's count from the
            // largest tag in it; after an end of epoch, it is in the next one, with no batch yet.
            let counted = attached.state.counted().clone();
            if pipeline.shape.even {
                match StreamPoint::of_tag(attached.largest_tag) {
                    Some(StreamPoint::Batch { epoch, number }) => counted.resume(epoch, number),
                    Some(StreamPoint::Ended { epoch }) => {
                        counted.resume(epoch.saturating_add(1), 0);
                    }
                    None => {}
                }
            }
            let started = writer::start(
                attached,
                pipeline.ring_schema.clone(),
                *rank,
                pipeline.stages.clone(),
                lease.clone(),
            )
            .map_err(DaemonError::Writer)?;
            started_rings.push((*rank, started, counted, epoch));
        }
        let local = (pipeline.shape.drop && ranks.len() == world_size as usize).then(|| {
            Arc::new(LocalFloor {
                counts: started_rings
                    .iter()
                    .map(|(_, _, counted, _)| counted.clone())
                    .collect(),
                told: settled.clone(),
            })
        });
        let mut rings = Vec::new();
        for (rank, started, counted, epoch) in started_rings {
            let (queue, jobs) = mpsc::unbounded_channel();
            let held = Arc::new(AtomicUsize::new(0));
            let feeder = tokio::spawn(feed(
                jobs,
                started.sender.clone(),
                pipeline.clone(),
                epoch,
                RingFeed {
                    source_wait: started.state.source_wait().clone(),
                    counted,
                    settled: told.clone(),
                    held: held.clone(),
                    local: local.clone(),
                },
            ));
            rings.push(RankRing {
                rank,
                held,
                queue,
                writer: started.sender,
                state: started.state,
                surveyed_read: 0,
                feeder,
                writer_thread: started.thread,
            });
        }
        Ok(Rings { rings, settled })
    }

    /// Takes the counts of `data.even_batches` the AM settled; the feeders pad by them.
    pub(crate) fn settle(&self, told: &v1::SettledBatches) {
        self.settled.send_if_modified(|settled| settled.merge(told));
    }

    /// The ranks, by ring index.
    pub(crate) fn ranks(&self) -> Vec<u32> {
        self.rings.iter().map(|ring| ring.rank).collect()
    }

    /// Every ring's rank and state, for the metrics endpoint.
    pub(crate) fn states(&self) -> Vec<(u32, Arc<RingState>)> {
        self.rings
            .iter()
            .map(|ring| (ring.rank, ring.state.clone()))
            .collect()
    }

    /// Whether a ring's feeder holds as many batches back as it may (`data.even_batches: drop`).
    pub(crate) fn holding_full(&self) -> bool {
        self.rings
            .iter()
            .any(|ring| ring.held.load(Ordering::Relaxed) >= HOLD_CAP)
    }

    /// Whether ring `index` holds no record its trainer has not read, and its feeder holds no
    /// batch back for it.
    pub(crate) fn is_empty(&self, index: usize) -> bool {
        self.rings.get(index).is_some_and(|ring| {
            ring.state.occupancy().0 == 0 && ring.held.load(Ordering::Relaxed) == 0
        })
    }

    /// The ring whose ledger holds task `task_id`, and the task's slot.
    pub(crate) fn bound(&self, task_id: TaskId) -> Option<(usize, LedgerTask)> {
        self.rings.iter().enumerate().find_map(|(index, ring)| {
            ring.state
                .ledger()
                .task(task_id.0)
                .map(|entry| (index, entry))
        })
    }

    /// Writes a task's binding or its new end into the ledger of ring `ring`.
    pub(crate) fn write_ledger(
        &self,
        ring: usize,
        task_id: TaskId,
        write: LedgerWrite,
    ) -> Result<()> {
        let state = &self.rings[ring].state;
        match write {
            LedgerWrite::Bind(entry) => state.bind(&entry).map_err(DaemonError::Ledger),
            LedgerWrite::SetEnd(end) => {
                state.ledger().set_end(task_id.0, end);
                Ok(())
            }
        }
    }

    /// Moves task `task_id`'s end in the ledger of ring `ring` to `end`.
    pub(crate) fn set_end(&self, ring: usize, task_id: TaskId, end: u64) {
        self.rings[ring].state.ledger().set_end(task_id.0, end);
    }

    /// Hands a task to the feeder of ring `ring`.
    pub(crate) fn feed(&self, ring: usize, job: Job) {
        // A feeder ends only when its queue is dropped, so the send cannot fail while the ring is
        // served.
        let _ = self.rings[ring].queue.send(job);
    }

    /// Frees the ledger slot of a task let go.
    pub(crate) fn free(&self, freed: Freed) {
        self.rings[freed.ring].state.ledger().free(freed.task_id.0);
    }

    /// Frees the ledger slot of every task bound to a ring that `holds` says this daemon does not
    /// hold.
    pub(crate) fn free_unheld(&self, holds: impl Fn(TaskId) -> bool) {
        for ring in &self.rings {
            let ledger = ring.state.ledger();
            let Ok(tasks) = ledger.tasks() else {
                continue;
            };
            for task in tasks {
                if !holds(TaskId(task.task_id)) {
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

    /// Asks the writers to survey their rings (fold what their trainers released into the ledgers):
    /// every ring when `due`, otherwise the rings whose trainers released more since their last
    /// survey. A writer busy with a full queue surveys later, and a full ring folds meanwhile.
    pub(crate) fn survey(&mut self, due: bool) {
        for ring in &mut self.rings {
            ring.state.watch_reads();
            let read = ring.state.read_cursor();
            if (due || read != ring.surveyed_read) && ring.writer.try_send(Write::Survey).is_ok() {
                ring.surveyed_read = read;
            }
        }
    }

    /// What the ledgers say of the tasks `placed` names, each with the index of its ring.
    pub(crate) fn counts(&self, placed: impl Iterator<Item = (TaskId, usize)>) -> Vec<Counts> {
        placed
            .filter_map(|(task_id, ring)| self.rings[ring].state.ledger().task(task_id.0))
            .map(Counts::from)
            .collect()
    }

    /// Every ring's occupancy and waits.
    pub(crate) fn stats(&self) -> Vec<v1::RingStats> {
        ring_stats(
            self.rings
                .iter()
                .map(|ring| (ring.rank, ring.state.as_ref())),
        )
    }

    /// The first ring writer's failure, if one failed.
    pub(crate) fn failure(&self) -> Option<DaemonError> {
        self.rings
            .iter()
            .find_map(|ring| ring.state.take_failure())
            .map(DaemonError::Writer)
    }

    /// Stops every ring's feeder and writer; a writer closes its ring only when its stream ends
    /// or is given back ([`Rings::end`], [`Rings::give_back`]). Returns the rings' states, by ring
    /// index.
    async fn stop(&mut self) -> Result<Vec<Arc<RingState>>> {
        let mut states = Vec::with_capacity(self.rings.len());
        for ring in std::mem::take(&mut self.rings) {
            ring.feeder.abort();
            drop(ring.queue);
            drop(ring.writer);
            let _ = ring.feeder.await;
            let rank = ring.rank;
            tokio::task::spawn_blocking(move || ring.writer_thread.join())
                .await
                .map_err(|error| DaemonError::WriterJoin { rank, error })?
                .map_err(|_| DaemonError::WriterPanicked { rank })?;
            states.push(ring.state);
        }
        Ok(states)
    }

    /// Fences every ring, the AM having declared this node lost: its writer drops what it was
    /// still to write and leaves an error record with `message` for its trainer, and its ledger
    /// forgets its tasks, which the AM queued again from their last reported counts. The record
    /// stays owed in the ledger until written, for a daemon started again to write first.
    pub(crate) async fn fence(&mut self, message: &str) -> Result<()> {
        for ring in &self.rings {
            ring.state.ledger().owe_fence();
            ring.state.fence(message.to_owned());
        }
        let states = self.stop().await?;
        for state in states {
            state.ledger().clear();
        }
        Ok(())
    }

    /// Ends every ring's stream, the job being over: each writer writes what it was given, then
    /// closes its ring, so that its trainer reads to the end and stops.
    pub(crate) async fn end(&mut self) -> Result<Vec<Arc<RingState>>> {
        for ring in &self.rings {
            ring.state.end();
        }
        self.stop().await
    }

    /// Stops every ring's writer for a scale: what it was asked to write is dropped, and it
    /// surveys its ring a last time (no trainer reads it any more, so the read cursor is final).
    /// Returns the rings' states, by ring index, for their final counts and then [`remove`].
    pub(crate) async fn give_back(&mut self) -> Result<Vec<Arc<RingState>>> {
        for ring in &self.rings {
            ring.state.give_back();
        }
        self.stop().await
    }
}

/// Removes the files of rings given back, with the rows still unread.
pub(crate) fn remove(states: Vec<Arc<RingState>>) -> Result<()> {
    for state in states {
        for file in state.files() {
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(DaemonError::RemoveRing { file, error }),
            }
        }
    }
    Ok(())
}

/// Each ring's occupancy and waits, by rank.
pub(crate) fn ring_stats<'a>(
    rings: impl IntoIterator<Item = (u32, &'a RingState)>,
) -> Vec<v1::RingStats> {
    rings
        .into_iter()
        .map(|(rank, state)| {
            let (used, capacity) = state.occupancy();
            let (trainer_wait, daemon_wait) = state.waits();
            let reading = state.reading();
            let source_wait = state.source_wait().waiting();
            let millis =
                |duration: Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
            v1::RingStats {
                reader_idle_ms: millis(reading.idle),
                reader_interval_ms: reading.interval.map_or(0, millis),
                source_wait_ms: source_wait.map_or(0, |(_, waited)| millis(waited).max(1)),
                source_task_id: source_wait.map_or(0, |(task, _)| task.0),
                rank,
                used_bytes: used,
                capacity_bytes: capacity,
                trainer_wait_ns: u64::try_from(trainer_wait.as_nanos()).unwrap_or(u64::MAX),
                daemon_wait_ns: u64::try_from(daemon_wait.as_nanos()).unwrap_or(u64::MAX),
                epoch_batches: state.counted().report(),
            }
        })
        .collect()
}

/// Rings of an earlier run of this node that it takes over, by rank.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    rings: BTreeMap<u32, Attached>,
}

/// The ledgers under `job_dir` beside a ring, by rank, with the ring's path.
fn ledgers(job_dir: &Path) -> Result<Vec<(u32, Ledger, PathBuf)>> {
    let entries = match std::fs::read_dir(job_dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => {
            return Err(DaemonError::ListRingDir {
                dir: job_dir.to_path_buf(),
                error,
            });
        }
    };
    let mut ledgers = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|error| DaemonError::ListRingEntry {
                dir: job_dir.to_path_buf(),
                error,
            })?
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
        // A ledger and ring that another user put here would hand this daemon forged counts.
        files::check_owned(&path).map_err(DaemonError::Untrusted)?;
        let ledger = Ledger::open(&path).map_err(DaemonError::Ledger)?;
        let ring_path = path.with_extension(RING_EXTENSION);
        if ring_path.exists() {
            files::check_owned(&ring_path).map_err(DaemonError::Untrusted)?;
            ledgers.push((rank, ledger, ring_path));
        }
    }
    Ok(ledgers)
}

impl Recovered {
    /// The node whose rings `job_dir` holds, for a daemon started again without a node id: the
    /// owner of the ledgers beside rings still open. An error when they belong to several nodes.
    pub(crate) fn owner(job_dir: &Path) -> Result<Option<NodeId>> {
        let mut nodes = BTreeSet::new();
        for (_, ledger, ring_path) in ledgers(job_dir)? {
            if !Ring::open(&ring_path)
                .map_err(DaemonError::RingOpen)?
                .is_closed()
            {
                nodes.insert(NodeId(ledger.owner()));
            }
        }
        match nodes.len() {
            0 | 1 => Ok(nodes.pop_first()),
            _ => Err(DaemonError::SeveralNodes {
                dir: job_dir.to_path_buf(),
                nodes: nodes.into_iter().collect(),
            }),
        }
    }

    /// Takes over the rings under `job_dir` whose ledgers belong to `node`. A ring its producer
    /// closed (the job ended) holds nothing to take over.
    pub(crate) fn take_over(job_dir: &Path, node: NodeId) -> Result<Recovered> {
        let mut recovered = Recovered::default();
        for (rank, ledger, ring_path) in ledgers(job_dir)? {
            if ledger.owner() != node.0 {
                continue;
            }
            let ring = Ring::open(&ring_path).map_err(DaemonError::RingOpen)?;
            if ring.is_closed() {
                continue;
            }
            let attached = writer::attach(ring, ledger).map_err(DaemonError::Writer)?;
            tracing::info!(
                rank,
                ring = %ring_path.display(),
                tasks = attached.state.ledger().tasks().map_or(0, |tasks| tasks.len()),
                "took over a ring this node fed before it restarted"
            );
            recovered.rings.insert(rank, attached);
        }
        Ok(recovered)
    }

    /// Whether no ring was taken over.
    pub(crate) fn is_empty(&self) -> bool {
        self.rings.is_empty()
    }

    /// The tasks the ledgers of the rings taken over hold, with their counts.
    pub(crate) fn held(&self) -> Result<Vec<v1::TaskProgress>> {
        let mut held = Vec::new();
        for attached in self.rings.values() {
            let tasks = attached
                .state
                .ledger()
                .tasks()
                .map_err(DaemonError::Ledger)?;
            held.extend(tasks.iter().map(|task| v1::TaskProgress {
                task_id: task.task_id,
                enqueued: task.enqueued_end.saturating_sub(task.start),
                consumed: task.consumed_end.saturating_sub(task.start),
                bad: Vec::new(),
                sent: task.enqueued_end.saturating_sub(task.start),
                dropped: Vec::new(),
            }));
        }
        Ok(held)
    }

    /// Empties the ledgers of the rings taken over that hold tasks: the AM fenced this node and
    /// queued its tasks again from their last reported counts. The rings keep the rows still in
    /// them, which their trainers read void: each ring owes its trainer the fence's error record,
    /// which its writer writes before anything else.
    pub(crate) fn forget_tasks(&self) {
        for attached in self.rings.values() {
            let ledger = attached.state.ledger();
            let tasks = ledger.tasks().map_or(0, |tasks| tasks.len());
            if tasks == 0 {
                continue;
            }
            tracing::warn!(ledger = %ledger.path().display(), tasks, "the AM fenced this node: its ledger is emptied, and its trainer told that its last reads are void");
            ledger.owe_fence();
            ledger.clear();
        }
    }

    /// Leaves the rings taken over that are not among the ranks served, as they are.
    pub(crate) fn leave_unserved(&mut self) {
        for (rank, attached) in std::mem::take(&mut self.rings) {
            tracing::warn!(rank, ring = %attached.state.ledger().path().display(), "a ring this node fed is no longer one of its ranks: left as it is");
        }
    }
}

/// Creates the ring of `rank`, or opens the one a previous daemon left without a ledger of this
/// node, and gives it an empty ledger owned by `node`.
fn open_ring(job_dir: &Path, rank: u32, size: u64, node: u64) -> Result<(Ring, Ledger)> {
    let path = job_dir.join(format!("{rank}.{RING_EXTENSION}"));
    let ring = if path.exists() {
        files::check_owned(&path).map_err(DaemonError::Untrusted)?;
        Ring::open(&path).map_err(DaemonError::RingOpen)?
    } else {
        RingOptions::new(&path)
            .capacity(size)
            .create()
            .map_err(DaemonError::RingCreate)?
    };
    let ledger = Ledger::create(Ledger::path_beside(&path), node).map_err(DaemonError::Ledger)?;
    Ok((ring, ledger))
}

/// Prepares the job's ring directory: makes it, and any directory missing above it, with `sharing`'s
/// mode, or refuses one of another user's (see [`files::ensure_dir`]); then removes the rings of an earlier run
/// that no process uses any more (they hold nothing anyone will read; a ring a trainer still reads
/// is kept, and so is one taken over).
pub(crate) fn prepare_dir(job_dir: &Path, sharing: Sharing) -> Result<()> {
    files::ensure_dir(job_dir, sharing).map_err(|error| DaemonError::CreateRingDir {
        dir: job_dir.to_path_buf(),
        error,
    })?;
    let collected =
        sluice_ring::gc::collect(job_dir).map_err(|error| DaemonError::CollectRings {
            dir: job_dir.to_path_buf(),
            error,
        })?;
    for removed in &collected.removed {
        tracing::info!(ring = %removed.display(), "removed a dead ring of an earlier run");
    }
    Ok(())
}

/// The epoch a ring's feeder starts in (see [`feed`]) when the ring is taken over as `mark` and
/// `largest_tag` find it, or opened empty while the job is in `current_epoch`; `None` when the first
/// task decides it.
fn resumed_epoch(mark: EpochMark, largest_tag: u64, even: bool, current_epoch: u32) -> Option<u32> {
    match StreamPoint::of_tag(largest_tag) {
        // With `data.even_batches` every record is tagged: the largest tag places the ring.
        Some(StreamPoint::Batch { epoch, .. }) if even => Some(epoch),
        // An end of epoch is tagged in every job: right after one, the ring is in the next epoch,
        // so that a task of a later epoch ends the epochs it got no task in.
        Some(StreamPoint::Ended { epoch }) if even || mark == EpochMark::EndOfEpoch => {
            Some(epoch.saturating_add(1))
        }
        _ => match mark {
            EpochMark::Batch { epoch } => Some(epoch),
            // With `data.even_batches`, the AM's settled counts place an empty ring.
            EpochMark::Start if !even => Some(current_epoch),
            // A ring whose end of epoch has no tag, from a release that tagged none.
            EpochMark::Start | EpochMark::EndOfEpoch => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Leaves the ring of `rank` with a ledger of `node` under `job_dir`, as a daemon that stopped.
    fn left_by(job_dir: &Path, rank: u32, node: u64) {
        open_ring(job_dir, rank, 64 * 1024, node).expect("a ring and its ledger");
    }

    #[test]
    fn a_daemon_without_a_node_id_finds_the_node_whose_rings_its_host_holds() {
        let directory = tempfile::tempdir().expect("tempdir");
        let job_dir = directory.path();
        assert_eq!(Recovered::owner(job_dir).expect("no ring"), None);
        left_by(job_dir, 0, 3);
        left_by(job_dir, 1, 3);
        assert_eq!(
            Recovered::owner(job_dir).expect("one node"),
            Some(NodeId(3))
        );
        left_by(job_dir, 2, 5);
        let error = Recovered::owner(job_dir).expect_err("two nodes");
        let message = error.to_string();
        assert!(message.contains("node-3 and node-5"), "{message}");
        assert!(message.contains("--node-id"), "{message}");
    }

    /// Writes `writes` into a new ring of rank 0 under `job_dir` and stops as a killed daemon does,
    /// then takes the ring over as the next daemon does: where its feeder starts, the job being in
    /// epoch 9.
    fn resumed_after(job_dir: &Path, writes: Vec<Write>, even: bool) -> Option<u32> {
        let (ring, ledger) = open_ring(job_dir, 0, 64 * 1024, 3).expect("a ring and its ledger");
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new("id", arrow::datatypes::DataType::Int64, false),
        ]));
        let started = writer::start(
            writer::attach(ring, ledger).expect("attached"),
            schema,
            0,
            Arc::default(),
            Arc::new(Lease::new()),
        )
        .expect("started");
        for write in writes {
            started
                .sender
                .blocking_send(write)
                .expect("the writer runs");
        }
        drop(started.sender);
        started.thread.join().expect("the writer ends");
        let path = job_dir.join(format!("0.{RING_EXTENSION}"));
        let ring = Ring::open(&path).expect("the ring");
        let ledger = Ledger::open(Ledger::path_beside(&path)).expect("its ledger");
        let attached = writer::attach(ring, ledger).expect("taken over");
        resumed_epoch(attached.mark, attached.largest_tag, even, 9)
    }

    #[test]
    fn a_ring_taken_over_right_after_an_end_of_epoch_is_in_the_next_epoch() {
        let ended = |epoch| Write::EndOfEpoch {
            tag: StreamPoint::Ended { epoch }.tag(),
        };
        for even in [false, true] {
            let directory = tempfile::tempdir().expect("tempdir");
            assert_eq!(
                resumed_after(directory.path(), vec![ended(3), ended(4)], even),
                Some(5),
                "even: {even}"
            );
        }
        // An end of epoch without a tag, as an older release wrote it: the first task decides.
        let directory = tempfile::tempdir().expect("tempdir");
        let untagged = vec![Write::EndOfEpoch { tag: 0 }];
        assert_eq!(resumed_after(directory.path(), untagged, false), None);
        // A ring opened empty starts in the job's epoch, or with even where the AM's counts say.
        let directory = tempfile::tempdir().expect("tempdir");
        assert_eq!(resumed_after(directory.path(), Vec::new(), false), Some(9));
        let directory = tempfile::tempdir().expect("tempdir");
        assert_eq!(resumed_after(directory.path(), Vec::new(), true), None);
    }

    #[test]
    fn a_closed_ring_names_no_node() {
        let directory = tempfile::tempdir().expect("tempdir");
        let job_dir = directory.path();
        left_by(job_dir, 0, 3);
        let ring = Ring::open(job_dir.join(format!("0.{RING_EXTENSION}"))).expect("the ring");
        ring.producer().expect("the producer role").close();
        assert_eq!(Recovered::owner(job_dir).expect("no open ring"), None);
    }
}

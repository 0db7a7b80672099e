//! One thread per ring: it owns the ring's producer, writes what the readers send, and records
//! where each batch ends so that the daemon can tell which rows the trainer has released.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use sluice_client::Encoder;
use sluice_ring::{Producer, RecordKind, RecordMeta, Ring};
use tokio::sync::mpsc;

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
    },
    /// The end of an epoch's data.
    EndOfEpoch,
}

/// Where a batch record ends in the ring, and the task rows it completes.
#[derive(Debug, Clone, Copy)]
struct Written {
    end_position: u64,
    task_id: u64,
    end_row: u64,
}

/// Batches of a ring, each as `(task, end row)`.
#[derive(Debug, Default)]
pub struct Progress {
    /// Released by the trainer.
    pub released: Vec<(u64, u64)>,
    /// Published to the trainer and not yet released.
    pub published: Vec<(u64, u64)>,
}

/// A started ring writer: where to send writes, what it knows of the ring, and its thread.
#[derive(Debug)]
pub struct Started {
    /// Where to send writes; dropping every sender closes the ring.
    pub sender: mpsc::Sender<Write>,
    /// The ring's state.
    pub state: Arc<RingState>,
    /// The writer thread.
    pub thread: std::thread::JoinHandle<()>,
}

/// What the daemon knows of one ring: the records written and not yet known to be released.
#[derive(Debug)]
pub struct RingState {
    ring: Ring,
    written: Mutex<VecDeque<Written>>,
    failure: Mutex<Option<String>>,
}

impl RingState {
    /// The batches the trainer released since the last call, and those only published, in ring
    /// order.
    pub fn progress(&self) -> Progress {
        let (write, read) = self.ring.cursors();
        let mut written = self
            .written
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut released = Vec::new();
        while let Some(front) = written.front()
            && front.end_position <= read
        {
            released.push((front.task_id, front.end_row));
            written.pop_front();
        }
        let published = written
            .iter()
            .take_while(|entry| entry.end_position <= write)
            .map(|entry| (entry.task_id, entry.end_row))
            .collect();
        Progress {
            released,
            published,
        }
    }

    /// Bytes written and not yet released, and the ring's capacity.
    pub fn occupancy(&self) -> (u64, u64) {
        let (write, read) = self.ring.cursors();
        (write.saturating_sub(read), self.ring.capacity())
    }

    /// Why the writer stopped, if it failed.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

/// Starts the writer thread of `ring`; it writes `schema` first and stops, closing the ring, once
/// every sender is dropped.
pub fn start(ring: Ring, schema: SchemaRef, rank: u32) -> Result<Started, String> {
    let producer = ring
        .producer()
        .map_err(|error| format!("ring {}: {error}", ring.path().display()))?;
    let state = Arc::new(RingState {
        ring,
        written: Mutex::new(VecDeque::new()),
        failure: Mutex::new(None),
    });
    let (sender, receiver) = mpsc::channel(4);
    let thread_state = state.clone();
    let handle = std::thread::Builder::new()
        .name(format!("ring-writer-{rank}"))
        .spawn(move || {
            if let Err(error) = write_loop(producer, &schema, receiver, &thread_state) {
                tracing::error!(rank, %error, "ring writer failed");
                *thread_state
                    .failure
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(error);
            }
        })
        .map_err(|error| format!("starting the writer of rank {rank}: {error}"))?;
    Ok(Started {
        sender,
        state,
        thread: handle,
    })
}

fn write_loop(
    mut producer: Producer,
    schema: &SchemaRef,
    mut receiver: mpsc::Receiver<Write>,
    state: &RingState,
) -> Result<(), String> {
    producer.set_peer_timeout(Duration::from_secs(24 * 3600));
    let mut encoder = Encoder::new(schema.clone()).map_err(|error| error.to_string())?;
    encoder
        .write_schema(&mut producer)
        .map_err(|error| error.to_string())?;
    producer.flush();
    while let Some(write) = receiver.blocking_recv() {
        match write {
            Write::Batch {
                batch,
                task_id,
                first_row,
                row_count,
            } => {
                encoder
                    .write_batch(&mut producer, &batch, task_id, first_row, row_count)
                    .map_err(|error| error.to_string())?;
                state
                    .written
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .push_back(Written {
                        end_position: producer.position(),
                        task_id,
                        end_row: first_row + row_count,
                    });
            }
            Write::EndOfEpoch => {
                let slot = producer.reserve(0).map_err(|error| error.to_string())?;
                slot.commit(RecordMeta::of_kind(RecordKind::EndOfEpoch));
            }
        }
        if receiver.is_empty() {
            producer.flush();
        }
    }
    producer.close();
    Ok(())
}

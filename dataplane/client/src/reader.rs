//! Reading record batches out of a ring, with the consumed position of every task.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::error::ArrowError;
use arrow::ipc::reader::StreamDecoder;
use sluice_ring::{Consumer, Lease, RecordKind, RecvError};

/// Why reading failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The ring failed: its producer is gone for good, or the file is damaged.
    #[error(transparent)]
    Ring(#[from] RecvError),
    /// A record did not hold a valid Arrow IPC message.
    #[error("record {sequence}: {source}")]
    Decode {
        /// The record's sequence number.
        sequence: u64,
        /// Arrow's error.
        source: ArrowError,
    },
    /// A batch came before any schema, and the ring has no schema file beside it.
    #[error(
        "record {sequence}: a batch before any schema; the producer must write the schema first"
    )]
    NoSchema {
        /// The record's sequence number.
        sequence: u64,
    },
    /// The schema file beside the ring could not be read.
    #[error("reading the ring's schema file {path}: {source}")]
    SchemaFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The daemon reported an error in the ring.
    #[error("the daemon reports: {0}")]
    Producer(String),
}

/// A decoder that has read the stream's schema from the schema file `path` beside the ring, for a
/// reader that attached after the schema record was read by an earlier one.
fn schema_from_file(path: &std::path::Path, sequence: u64) -> Result<StreamDecoder, ReadError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Err(ReadError::NoSchema { sequence });
        }
        Err(source) => {
            return Err(ReadError::SchemaFile {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let mut decoder = StreamDecoder::new();
    decoder
        .decode(&mut Buffer::from(bytes))
        .map_err(|source| ReadError::Decode { sequence, source })?;
    Ok(decoder)
}

/// A buffer over the payload of `lease`, which it keeps: the bytes stay in the ring, unwritten by
/// the producer, until the last array using them is dropped.
fn in_place(lease: Lease) -> Buffer {
    let payload = lease.payload();
    let (address, length) = (payload.as_ptr(), payload.len());
    let owner: Arc<Lease> = Arc::new(lease);
    // A payload of a record is never at address 0, even when empty: it lies inside the mapping.
    let address = NonNull::new(address.cast_mut()).expect("a mapped payload");
    // SAFETY: the lease keeps the ring mapped and these `length` bytes from the producer until it is
    // dropped, and the buffer holds the lease as its owner, so the bytes outlive the buffer and every
    // slice of it; nothing writes them through the buffer, which Arrow never mutates in place.
    unsafe { Buffer::from_custom_allocation(address, length, owner) }
}

/// One item of the stream.
#[derive(Debug, Clone)]
pub enum Item {
    /// A batch of rows of one task.
    Batch {
        /// The rows.
        batch: RecordBatch,
        /// The task they belong to.
        task_id: u64,
        /// The split row of the first row.
        first_row: u64,
        /// The split rows the batch covers.
        row_count: u64,
    },
    /// The end of an epoch's data for this ring.
    EndOfEpoch,
}

/// Reads a ring's records as Arrow record batches, in place: a batch's buffers point into the
/// ring, and its record goes back to the daemon when the batch (every array sliced from it
/// included) is dropped. A reader that holds batches holds back the ring's space after them, so
/// the daemon waits once the ring is full of held batches.
#[derive(Debug)]
pub struct Reader {
    consumer: Consumer,
    decoder: StreamDecoder,
    has_schema: bool,
    /// The schema file beside the ring.
    schema_file: std::path::PathBuf,
    positions: BTreeMap<u64, u64>,
}

impl Reader {
    /// Reads the records of `consumer`.
    pub fn new(consumer: Consumer) -> Reader {
        let schema_file = sluice_ring::schema_path_beside(consumer.ring_path());
        Reader {
            consumer,
            decoder: StreamDecoder::new(),
            has_schema: false,
            schema_file,
            positions: BTreeMap::new(),
        }
    }

    /// The next item, waiting for the daemon; `None` once the daemon closed the ring.
    pub fn next_item(&mut self) -> Result<Option<Item>, ReadError> {
        loop {
            let Some(record) = self.consumer.next()? else {
                return Ok(None);
            };
            let meta = record.meta();
            let sequence = record.sequence();
            match meta.kind {
                RecordKind::Schema => {
                    let mut buffer = Buffer::from(record.payload());
                    drop(record);
                    self.decoder = StreamDecoder::new();
                    self.decoder
                        .decode(&mut buffer)
                        .map_err(|source| ReadError::Decode { sequence, source })?;
                    self.has_schema = true;
                }
                RecordKind::Batch => {
                    if !self.has_schema {
                        // The stream's schema record went to an earlier trainer of the ring; its
                        // producer keeps the schema beside the ring for this one.
                        self.decoder = schema_from_file(&self.schema_file, sequence)?;
                        self.has_schema = true;
                    }
                    let mut buffer = in_place(record.lease());
                    let batch = self
                        .decoder
                        .decode(&mut buffer)
                        .map_err(|source| ReadError::Decode { sequence, source })?
                        .ok_or_else(|| ReadError::Decode {
                            sequence,
                            source: ArrowError::IpcError(
                                "the record holds no complete record batch message".to_owned(),
                            ),
                        })?;
                    let end = meta.first_row + meta.row_count;
                    let position = self.positions.entry(meta.task_id).or_insert(end);
                    *position = (*position).max(end);
                    return Ok(Some(Item::Batch {
                        batch,
                        task_id: meta.task_id,
                        first_row: meta.first_row,
                        row_count: meta.row_count,
                    }));
                }
                RecordKind::Dropped => {
                    // Rows of the epoch it was told to leave out: read, but not handed out.
                    drop(record);
                    let end = meta.first_row + meta.row_count;
                    let position = self.positions.entry(meta.task_id).or_insert(end);
                    *position = (*position).max(end);
                }
                RecordKind::EndOfEpoch => {
                    drop(record);
                    self.positions.clear();
                    return Ok(Some(Item::EndOfEpoch));
                }
                RecordKind::Error => {
                    let message = String::from_utf8_lossy(record.payload()).into_owned();
                    return Err(ReadError::Producer(message));
                }
            }
        }
    }

    /// The end of the records released so far, in bytes of the ring's stream: before the first
    /// item, where the ring's read cursor stands, which is where the releases of the ring's earlier
    /// trainers stopped.
    pub fn released(&self) -> u64 {
        self.consumer.position()
    }

    /// The end, in bytes of the ring's stream, of the record of the last item handed out: the
    /// read cursor once that item's batch and every one before it are released.
    pub fn handed_out(&self) -> u64 {
        self.consumer.handed_out()
    }

    /// The address range of the ring's data in this process: the buffers of every batch lie in it.
    pub fn data_region(&self) -> std::ops::Range<usize> {
        self.consumer.data_region()
    }

    /// The split row up to which this reader handed out each task of the current epoch: the
    /// position a data checkpoint records for this rank once those batches are dropped.
    pub fn positions(&self) -> &BTreeMap<u64, u64> {
        &self.positions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Encoder, write_error};
    use arrow::array::{Float32Array, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use sluice_ring::{RecordMeta, Ring, RingOptions};
    use std::sync::Arc;

    fn batch(first: i64, rows: usize) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("x", DataType::Float32, true),
            Field::new("name", DataType::Utf8, true),
        ]));
        let ids: Vec<i64> = (first..first + rows as i64).collect();
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(ids.clone())),
                Arc::new(Float32Array::from_iter(
                    ids.iter()
                        .map(|id| (id % 3 != 0).then_some(*id as f32 * 0.5)),
                )),
                Arc::new(StringArray::from_iter(
                    ids.iter()
                        .map(|id| (id % 5 != 0).then(|| format!("row-{id}"))),
                )),
            ],
        )
        .expect("batch")
    }

    fn ring(directory: &std::path::Path) -> (sluice_ring::Producer, Reader) {
        let path = directory.join("0.ring");
        let created = RingOptions::new(&path)
            .capacity(1 << 20)
            .create()
            .expect("create ring");
        let producer = created.producer().expect("producer");
        let consumer = Ring::open(&path)
            .expect("open")
            .consumer()
            .expect("consumer");
        (producer, Reader::new(consumer))
    }

    #[test]
    fn batches_cross_the_ring_intact_with_their_positions() {
        let directory = tempfile::tempdir().expect("tempdir");
        let (mut producer, mut sut) = ring(directory.path());
        let first = batch(0, 100);
        let mut encoder = Encoder::new(first.schema()).expect("encoder");
        encoder.write_schema(&mut producer).expect("schema");
        encoder
            .write_batch(&mut producer, &first, 7, 1000, 120)
            .expect("batch");
        // A slice shares the batch's buffers, longer than its rows: only its rows cross.
        let wide = batch(100, 200);
        encoder
            .write_batch(&mut producer, &wide.slice(0, 50), 7, 1120, 50)
            .expect("batch");
        // Rows of task 7 the reader counts as read and hands out nothing of.
        let mut dropped = producer.reserve(0).expect("reserve");
        dropped.payload_mut();
        dropped.commit(RecordMeta {
            kind: RecordKind::Dropped,
            task_id: 7,
            first_row: 1170,
            row_count: 30,
            tag: 0,
        });
        encoder
            .write_batch(&mut producer, &batch(140, 20).slice(10, 10), 9, 0, 10)
            .expect("batch");
        let mut end = producer.reserve(0).expect("reserve");
        end.payload_mut();
        end.commit(RecordMeta::of_kind(RecordKind::EndOfEpoch));
        producer.close();

        let mut seen = Vec::new();
        while let Some(item) = sut.next_item().expect("read") {
            match item {
                Item::Batch {
                    batch: received,
                    task_id,
                    first_row,
                    row_count,
                } => {
                    seen.push((task_id, first_row, row_count, received.num_rows()));
                    let expected = match (task_id, first_row) {
                        (7, 1000) => first.clone(),
                        (7, 1120) => batch(100, 50),
                        _ => batch(150, 10),
                    };
                    assert_eq!(received, expected, "values, nulls and strings survive");
                    if task_id == 7 && first_row == 1000 {
                        assert_eq!(sut.positions()[&7], 1120);
                    }
                    if task_id == 9 {
                        assert_eq!(sut.positions()[&7], 1200, "dropped rows count as read");
                    }
                }
                Item::EndOfEpoch => {
                    assert_eq!(seen.len(), 3);
                    assert!(sut.positions().is_empty(), "positions are per epoch");
                }
            }
        }
        assert_eq!(
            seen,
            vec![(7, 1000, 120, 100), (7, 1120, 50, 50), (9, 0, 10, 10)]
        );
    }

    #[test]
    fn nested_and_sliced_columns_cross_the_ring_and_a_slice_costs_only_its_rows() {
        use arrow::array::{Array, ArrayRef, BooleanArray, ListArray, StructArray};
        use arrow::datatypes::Float32Type;

        let rows = 4000_usize;
        let base = batch(0, rows);
        let lists = ListArray::from_iter_primitive::<Float32Type, _, _>((0..rows).map(|row| {
            (row % 7 != 0).then(|| {
                (0..row % 5)
                    .map(|value| Some(value as f32))
                    .collect::<Vec<_>>()
            })
        }));
        let flags =
            BooleanArray::from_iter((0..rows).map(|row| (row % 11 != 0).then_some(row % 2 == 0)));
        let nested = StructArray::from(vec![
            (
                Arc::new(Field::new("flag", DataType::Boolean, true)),
                Arc::new(flags.clone()) as ArrayRef,
            ),
            (
                Arc::new(Field::new("id", DataType::Int64, false)),
                base.column(0).clone(),
            ),
        ]);
        let mut fields = base.schema().fields().to_vec();
        fields.push(Arc::new(Field::new(
            "list",
            lists.data_type().clone(),
            true,
        )));
        fields.push(Arc::new(Field::new("flags", DataType::Boolean, true)));
        fields.push(Arc::new(Field::new(
            "nested",
            nested.data_type().clone(),
            false,
        )));
        let mut columns = base.columns().to_vec();
        columns.push(Arc::new(lists));
        columns.push(Arc::new(flags));
        columns.push(Arc::new(nested));
        let wide = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("batch");

        let directory = tempfile::tempdir().expect("tempdir");
        let (mut producer, mut sut) = ring(directory.path());
        let mut encoder = Encoder::new(wide.schema()).expect("encoder");
        encoder.write_schema(&mut producer).expect("schema");
        let start = producer.position();
        encoder
            .write_batch(&mut producer, &wide, 1, 0, rows as u64)
            .expect("whole batch");
        let whole = producer.position() - start;
        let start = producer.position();
        // Offsets not on a byte boundary, nulls, lists and a struct.
        let slices = [wide.slice(0, 40), wide.slice(1003, 37)];
        for (index, slice) in slices.iter().enumerate() {
            encoder
                .write_batch(&mut producer, slice, 2, index as u64 * 40, 40)
                .expect("slice");
        }
        let sliced = producer.position() - start;
        producer.close();
        assert!(
            sliced * 20 < whole,
            "two slices of 40 and 37 rows took {sliced} bytes, the {rows}-row batch {whole}"
        );
        let mut received = Vec::new();
        while let Some(item) = sut.next_item().expect("read") {
            if let Item::Batch { batch, .. } = item {
                received.push(batch);
            }
        }
        assert_eq!(received.len(), 3);
        assert_eq!(received[0], wide);
        assert_eq!(received[1], slices[0]);
        assert_eq!(received[2], slices[1]);
    }

    #[test]
    fn batches_point_into_the_ring_and_release_their_record_when_dropped() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("0.ring");
        let ring = RingOptions::new(&path)
            .capacity(1 << 20)
            .create()
            .expect("create ring");
        let mut producer = ring.producer().expect("producer");
        let mut sut = Reader::new(
            Ring::open(&path)
                .expect("open")
                .consumer()
                .expect("consumer"),
        );
        let mut encoder = Encoder::new(batch(0, 1).schema()).expect("encoder");
        encoder.write_schema(&mut producer).expect("schema");
        for first in [0, 100] {
            encoder
                .write_batch(&mut producer, &batch(first, 100), 1, first as u64, 100)
                .expect("batch");
        }
        producer.close();
        let region = sut.data_region();
        let mut held = Vec::new();
        while let Some(item) = sut.next_item().expect("read") {
            if let Item::Batch {
                batch: received, ..
            } = item
            {
                for column in received.columns() {
                    for buffer in column.to_data().buffers() {
                        let address = buffer.as_ptr() as usize;
                        assert!(region.contains(&address), "a buffer outside the ring");
                    }
                }
                held.push(received);
            }
        }
        let (write, read) = ring.cursors();
        assert!(read < write, "held batches hold their records");
        assert_eq!(held[1], batch(100, 100), "a held batch stays intact");
        drop(held);
        drop(sut);
        let (write, read) = ring.cursors();
        assert_eq!(read, write, "dropped batches released every record");
    }

    #[test]
    fn a_reader_started_again_reads_on_where_the_releases_stopped() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("0.ring");
        let (mut producer, mut first) = ring(directory.path());
        let mut encoder = Encoder::new(batch(0, 1).schema()).expect("encoder");
        encoder.write_schema_file(&path).expect("schema file");
        encoder.write_schema(&mut producer).expect("schema");
        for start in [0, 10, 20] {
            encoder
                .write_batch(&mut producer, &batch(start, 10), 1, start as u64, 10)
                .expect("batch");
        }
        producer.flush();
        assert_eq!(
            first.released(),
            0,
            "a new ring is released up to its start"
        );
        let Some(Item::Batch { batch: held, .. }) = first.next_item().expect("item") else {
            panic!("expected the first batch");
        };
        let first_end = first.handed_out();
        assert!(
            first.released() < first_end,
            "a batch held is handed out, not released"
        );
        drop(held);
        assert_eq!(first.released(), first_end, "dropped, it is released");
        drop(first);
        let mut next = Reader::new(
            Ring::open(&path)
                .expect("open")
                .consumer()
                .expect("the next trainer's consumer"),
        );
        assert_eq!(
            next.released(),
            first_end,
            "the next reader starts where the releases stopped"
        );
        match next.next_item().expect("item") {
            Some(Item::Batch { batch: read, .. }) => assert_eq!(read, batch(10, 10)),
            other => panic!("expected the second batch, got {other:?}"),
        }
        assert!(next.handed_out() > first_end);
    }

    #[test]
    fn a_batch_before_any_schema_and_a_daemon_error_are_reported() {
        let directory = tempfile::tempdir().expect("tempdir");
        let (mut producer, mut sut) = ring(directory.path());
        Encoder::new(batch(0, 3).schema())
            .expect("encoder")
            .write_batch(&mut producer, &batch(0, 3), 1, 0, 3)
            .expect("batch");
        write_error(&mut producer, "source s3://b/x.parquet: corrupt footer").expect("error");
        producer.close();
        assert!(matches!(
            sut.next_item(),
            Err(ReadError::NoSchema { sequence: 0 })
        ));
        let error = sut.next_item().expect_err("the daemon's error");
        assert_eq!(
            error.to_string(),
            "the daemon reports: source s3://b/x.parquet: corrupt footer"
        );
    }

    #[test]
    fn a_reader_that_attaches_after_the_schema_record_was_read_takes_the_schema_file() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("0.ring");
        let (mut producer, mut first) = ring(directory.path());
        let mut encoder = Encoder::new(batch(0, 3).schema()).expect("encoder");
        encoder.write_schema_file(&path).expect("schema file");
        encoder.write_schema(&mut producer).expect("schema");
        encoder
            .write_batch(&mut producer, &batch(0, 3), 1, 0, 3)
            .expect("batch");
        encoder
            .write_batch(&mut producer, &batch(3, 4), 1, 3, 4)
            .expect("batch");
        producer.flush();
        // The first trainer reads the schema and a batch, then is gone.
        match first.next_item().expect("item") {
            Some(Item::Batch { batch: read, .. }) => assert_eq!(read, batch(0, 3)),
            other => panic!("expected the first batch, got {other:?}"),
        }
        drop(first);
        let consumer = Ring::open(&path)
            .expect("open")
            .consumer()
            .expect("the next trainer's consumer");
        let mut next = Reader::new(consumer);
        match next.next_item().expect("item") {
            Some(Item::Batch { batch: read, .. }) => assert_eq!(read, batch(3, 4)),
            other => panic!("expected the second batch, got {other:?}"),
        }
    }
}

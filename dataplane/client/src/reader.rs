//! Reading record batches out of a ring, with the consumed position of every task.

use std::collections::BTreeMap;

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::error::ArrowError;
use arrow::ipc::reader::StreamDecoder;
use sluice_ring::{Consumer, RecordKind, RecvError};

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
    /// A batch came before any schema.
    #[error(
        "record {sequence}: a batch before any schema; the producer must write the schema first"
    )]
    NoSchema {
        /// The record's sequence number.
        sequence: u64,
    },
    /// The daemon reported an error in the ring.
    #[error("the daemon reports: {0}")]
    Producer(String),
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

/// Reads a ring's records as Arrow record batches.
///
/// Each batch is decoded from a copy of its record, so the record goes back to the daemon at once
/// and the batch lives as long as the caller wants; Python trainers read the same records in place
/// instead.
#[derive(Debug)]
pub struct Reader {
    consumer: Consumer,
    decoder: StreamDecoder,
    has_schema: bool,
    positions: BTreeMap<u64, u64>,
}

impl Reader {
    /// Reads the records of `consumer`.
    pub fn new(consumer: Consumer) -> Reader {
        Reader {
            consumer,
            decoder: StreamDecoder::new(),
            has_schema: false,
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
                        return Err(ReadError::NoSchema { sequence });
                    }
                    let mut buffer = Buffer::from(record.payload());
                    drop(record);
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

    /// The split row up to which this reader consumed each task of the current epoch: the
    /// position a data checkpoint records for this rank.
    pub fn positions(&self) -> &BTreeMap<u64, u64> {
        &self.positions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{write_batch, write_error, write_schema};
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
        write_schema(&mut producer, first.schema().as_ref()).expect("schema");
        write_batch(&mut producer, &first, 7, 1000, 120).expect("batch");
        write_batch(&mut producer, &batch(100, 50), 7, 1120, 50).expect("batch");
        write_batch(&mut producer, &batch(150, 10), 9, 0, 10).expect("batch");
        let mut end = producer.reserve(0).expect("reserve");
        end.payload_mut();
        end.commit(RecordMeta::of_kind(RecordKind::EndOfEpoch));
        producer.close();

        let mut seen = Vec::new();
        while let Some(item) = sut.next_item().expect("read") {
            match item {
                Item::Batch {
                    batch,
                    task_id,
                    first_row,
                    row_count,
                } => {
                    seen.push((task_id, first_row, row_count, batch.num_rows()));
                    if task_id == 7 && first_row == 1000 {
                        assert_eq!(batch, first, "values, nulls and strings survive");
                        assert_eq!(sut.positions()[&7], 1120);
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
    fn a_batch_before_any_schema_and_a_daemon_error_are_reported() {
        let directory = tempfile::tempdir().expect("tempdir");
        let (mut producer, mut sut) = ring(directory.path());
        write_batch(&mut producer, &batch(0, 3), 1, 0, 3).expect("batch");
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
}

//! What a task's rows go through between the reader and the ring writer: the read with exact
//! coverage, the row permutation when the job shuffles, the transforms, and the batching.
//!
//! # Implementation
//! Positions are the task's order positions (split rows in the split's delivery order; without a
//! shuffle, split rows). The reader gives every batch the contiguous range of positions it covers,
//! rows removed by the filter or a deletion vector included ([`SplitBatch`]), and the ranges tile
//! the task. The [`Batcher`] only ever joins neighbouring batches or cuts one at a row, so what it
//! hands on still tiles the task, and a piece can be cut again at the stop row.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, RecordBatch};
use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use futures::StreamExt;
use futures::stream::{self, BoxStream};
use sluice_formats::SplitBatch;
use sluice_proto::v1;

use crate::error::FeedError;
use crate::shuffle::{permute, split_order};
use crate::sources::Source;
use crate::stats::Stages;
use crate::transform::{TransformError, Transforms};

/// How the job shapes every task: from `JobData`.
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    /// Rows per batch read, and per batch written when `fixed_batch_size` is set.
    pub(crate) batch_rows: usize,
    /// Whether every batch but a task's last holds exactly `batch_rows` rows.
    pub(crate) fixed_batch_size: bool,
    /// The preprocessing steps.
    pub(crate) transforms: Transforms,
    /// The shuffle, when the job has one.
    pub(crate) shuffle: Option<ShuffleOptions>,
    /// What a read does with rows that do not decode.
    pub(crate) on_bad_data: v1::BadDataPolicy,
    /// Whether rings end each epoch at its settled batch count (`data.even_batches: pad | drop`):
    /// they count and tag their batches, and every batch carries the boolean column
    /// [`PAD_COLUMN`].
    pub(crate) even: bool,
    /// Whether rings drop their batches past the settled count (`data.even_batches: drop`), and
    /// hold back those past what the AM allows until then, rather than pad up to it.
    pub(crate) drop: bool,
}

/// The column `data.even_batches` adds to every batch: true in the rows of a pad batch. With
/// `drop`, a ring pads only when a daemon started again lost batches it held (see the AM's
/// `even` module).
pub(crate) const PAD_COLUMN: &str = "_sluice_pad";

/// The daemon's part of `data.shuffle`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShuffleOptions {
    /// The job seed.
    pub(crate) seed: u64,
    /// Open tasks interleaved per ring.
    pub(crate) window: usize,
}

impl Shape {
    /// The shape of the job's data.
    pub(crate) fn from_job(data: &v1::JobData) -> Result<Self, TransformError> {
        Ok(Self {
            batch_rows: data.batch_size.max(1) as usize,
            fixed_batch_size: data.fixed_batch_size,
            transforms: Transforms::from_job(&data.transforms)?,
            shuffle: data.shuffle.then(|| ShuffleOptions {
                seed: data.shuffle_seed,
                window: data.shuffle_window.max(1) as usize,
            }),
            on_bad_data: data.on_bad_data(),
            even: data.even_batches() != v1::EvenBatches::Off,
            drop: data.even_batches() == v1::EvenBatches::Drop,
        })
    }

    /// The schema of the batches written to the rings, from the transforms' output: with the pad
    /// column last with `data.even_batches`.
    pub(crate) fn ring_schema(&self, schema: &SchemaRef) -> SchemaRef {
        if !self.even {
            return schema.clone();
        }
        let mut fields: Vec<FieldRef> = schema.fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(PAD_COLUMN, DataType::Boolean, false)));
        Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
    }

    /// How many tasks a ring interleaves: 1 without a shuffle.
    pub(crate) fn window(&self) -> usize {
        self.shuffle.map_or(1, |shuffle| shuffle.window)
    }
}

/// The formats layer's split for `row_count` rows from `first_row` of the assignment's file: rows
/// of the assignment's split, so the split's bytes hold them, read from the file as planned.
fn read_split(
    assignment: &v1::TaskAssignment,
    split: &v1::Split,
    first_row: u64,
    row_count: u64,
) -> sluice_formats::Split {
    sluice_formats::Split {
        task_id: assignment.task_id,
        uri: split.uri.clone(),
        file_size: split.file_size,
        first_row,
        row_count,
        partition_values: split
            .partition_values
            .iter()
            .map(|value| (value.name.clone(), value.value.clone()))
            .collect(),
        delta: split
            .delta
            .as_ref()
            .map(|delta| sluice_formats::DeltaSplitInfo {
                version: delta.version,
                deletion_vector: delta.deletion_vector.as_ref().map(|vector| {
                    sluice_formats::DeletionVector {
                        storage_type: vector.storage_type.clone(),
                        path_or_inline_dv: vector.path_or_inline_dv.clone(),
                        offset: vector.offset,
                        size_in_bytes: vector.size_in_bytes,
                        cardinality: vector.cardinality,
                    }
                }),
            }),
        bytes: split.bytes.map(|bytes| sluice_formats::SplitBytes {
            start: bytes.start,
            end: bytes.end,
            first_row: bytes.first_row,
            rows: bytes.rows,
            crc32c: bytes.crc32c,
        }),
        identity: split
            .identity
            .as_ref()
            .map(|identity| sluice_formats::ObjectIdentity {
                e_tag: identity.e_tag.clone(),
                version: identity.version.clone(),
                modified_ns: identity.modified_ns,
            }),
    }
}

/// The bytes of `batch`'s rows: a batch cut from a larger one (a fixed-size batch cut from the
/// batches it joined) counts its share of the buffers it shares, not the whole buffers
/// ([`RecordBatch::get_array_memory_size`]), so that the pieces of a batch hold its size once.
pub(crate) fn batch_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|column| {
            column
                .to_data()
                .get_slice_memory_size()
                .unwrap_or_else(|_| column.get_array_memory_size())
        })
        .sum()
}

/// Joins batches until they hold enough rows, and cuts them to size when the batch size is fixed.
///
/// Without a fixed size, a batch with rows goes out as soon as it comes, with the coverage of the
/// empty batches before it; with one, every batch out holds exactly `rows` rows, except the last.
#[derive(Debug)]
pub(crate) struct Batcher {
    fixed_rows: Option<usize>,
    pending: Vec<SplitBatch>,
    pending_rows: usize,
}

impl Batcher {
    /// A batcher that cuts batches of exactly `fixed_rows` rows, or passes them on when `None`.
    pub(crate) fn new(fixed_rows: Option<usize>) -> Self {
        Self {
            fixed_rows: fixed_rows.map(|rows| rows.max(1)),
            pending: Vec::new(),
            pending_rows: 0,
        }
    }

    /// Takes a batch that follows the previous one; returns the batches that are ready.
    pub(crate) fn push(&mut self, covered: SplitBatch) -> Result<Vec<SplitBatch>, FeedError> {
        self.pending_rows += covered.batch.num_rows();
        self.pending.push(covered);
        let mut ready = Vec::new();
        match self.fixed_rows {
            None if self.pending_rows > 0 => ready.extend(self.take_pending()?),
            None => {}
            Some(rows) => {
                while self.pending_rows >= rows {
                    let Some(joined) = self.take_pending()? else {
                        break;
                    };
                    let (head, tail) = joined.split_at_rows(rows)?;
                    ready.push(head);
                    if tail.row_count > 0 {
                        self.pending_rows = tail.batch.num_rows();
                        self.pending.push(tail);
                    }
                }
            }
        }
        Ok(ready)
    }

    /// The last batch: whatever is pending, once the input ended.
    pub(crate) fn finish(&mut self) -> Result<Option<SplitBatch>, FeedError> {
        self.take_pending()
    }

    fn take_pending(&mut self) -> Result<Option<SplitBatch>, FeedError> {
        self.pending_rows = 0;
        let parts = std::mem::take(&mut self.pending);
        if parts.is_empty() {
            return Ok(None);
        }
        Ok(Some(SplitBatch::concat(&parts)?))
    }
}

/// Where a task's read tells of the rows it skipped because they did not decode.
pub(crate) type Skipped = Arc<dyn Fn(v1::BadRange) + Send + Sync>;

/// Reads `read`, rows of a split from its row `offset` on, as covered batches whose rows count
/// from the split's first row. With `skipping` (whether to log each skip as a warning, and where
/// to tell of it), rows that do not decode are skipped to the end of their unit (a CSV or JSON
/// lines record alone, the rest of a Parquet row group, or of a TFRecord or Arrow IPC split: see
/// [`sluice_formats::Dataset::bad_data_unit`]):
/// an empty batch covers them, and the read opens again after them. Any other error ends the
/// read.
fn read_covered(
    source: &Arc<Source>,
    read: sluice_formats::Split,
    offset: u64,
    skipping: Option<(bool, Skipped)>,
) -> BoxStream<'static, Result<SplitBatch, FeedError>> {
    let reading = CoveredRead {
        source: Arc::clone(source),
        read,
        offset,
        skipping,
        batches: None,
        next_row: 0,
        ended: false,
    };
    stream::unfold(reading, CoveredRead::advance).boxed()
}

/// The state of [`read_covered`].
struct CoveredRead {
    source: Arc<Source>,
    read: sluice_formats::Split,
    offset: u64,
    skipping: Option<(bool, Skipped)>,
    /// The open read of the rows from the one covered last on, rows counted from `read`'s first.
    batches: Option<BoxStream<'static, sluice_formats::Result<SplitBatch>>>,
    /// The rows of `read` covered so far.
    next_row: u64,
    ended: bool,
}

impl CoveredRead {
    async fn advance(mut self) -> Option<(Result<SplitBatch, FeedError>, Self)> {
        if self.ended {
            return None;
        }
        let error = loop {
            match self.batches.as_mut() {
                None => {
                    if self.next_row >= self.read.row_count {
                        return None;
                    }
                    let rest = sluice_formats::Split {
                        first_row: self.read.first_row + self.next_row,
                        row_count: self.read.row_count - self.next_row,
                        ..self.read.clone()
                    };
                    match self
                        .source
                        .dataset
                        .read_split_covered(&rest, &self.source.options)
                        .await
                    {
                        Ok(batches) => {
                            let base = self.next_row;
                            self.batches = Some(
                                batches
                                    .map(move |covered| {
                                        covered.map(|mut covered| {
                                            covered.first_row += base;
                                            covered
                                        })
                                    })
                                    .boxed(),
                            );
                        }
                        Err(error) => break error,
                    }
                }
                Some(batches) => match batches.next().await {
                    None => return None,
                    Some(Ok(mut covered)) => {
                        self.next_row = covered.end();
                        covered.first_row += self.offset;
                        return Some((Ok(covered), self));
                    }
                    Some(Err(error)) => break error,
                },
            }
        };
        let Some((warn, skipped)) = self
            .skipping
            .as_ref()
            .filter(|_| error.is_bad_data() && self.next_row < self.read.row_count)
        else {
            self.ended = true;
            return Some((Err(FeedError::Read(error)), self));
        };
        let from = self.next_row;
        // A record of a row format that does not decode alone is skipped alone; a footer that
        // cannot be read again leaves the rest of the read as the unit.
        let unit = if error.is_one_record() {
            sluice_formats::BadDataUnit {
                row_group: None,
                end: from + 1,
            }
        } else {
            self.source
                .dataset
                .bad_data_unit(&self.read, from)
                .await
                .unwrap_or(sluice_formats::BadDataUnit {
                    row_group: None,
                    end: self.read.row_count,
                })
        };
        let end = unit.end.clamp(from + 1, self.read.row_count);
        let range = v1::BadRange {
            uri: self.read.uri.clone(),
            row_group: unit.row_group,
            first_row: self.offset + from,
            row_count: end - from,
            cause: error.to_string(),
        };
        if *warn {
            tracing::warn!(
                uri = %range.uri,
                row_group = ?range.row_group,
                first_row = range.first_row,
                rows = range.row_count,
                cause = %range.cause,
                "rows that do not decode skipped (data.on_bad_data)"
            );
        }
        skipped(range);
        self.next_row = end;
        self.batches = None;
        let covering = SplitBatch::empty(
            Arc::clone(&self.source.schema),
            self.offset + from,
            end - from,
        );
        Some((Ok(covering), self))
    }
}

/// One task's batches, ready for the ring: read, permuted, transformed and batched.
pub(crate) struct TaskFeed {
    batches: BoxStream<'static, Result<SplitBatch, FeedError>>,
    transforms: Transforms,
    batcher: Batcher,
    ready: VecDeque<SplitBatch>,
    done: bool,
}

impl std::fmt::Debug for TaskFeed {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("TaskFeed")
            .field("ready", &self.ready.len())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl TaskFeed {
    /// Starts reading the task `[start, end)` of `assignment`. Without a shuffle the rows stream;
    /// with one the whole split is read and put in its delivery order first.
    pub(crate) async fn open(
        assignment: &v1::TaskAssignment,
        source: &Arc<Source>,
        shape: &Shape,
        skipped: Skipped,
    ) -> Result<Self, FeedError> {
        let split = assignment.split.as_ref().ok_or(FeedError::NoSplit {
            task_id: assignment.task_id,
        })?;
        let (start, end) = (assignment.start, assignment.end);
        if start > end || end > split.row_count {
            return Err(FeedError::RowsOutsideSplit {
                task_id: assignment.task_id,
                start,
                end,
                rows: split.row_count,
            });
        }
        let skipping = match shape.on_bad_data {
            v1::BadDataPolicy::Fail => None,
            v1::BadDataPolicy::Skip => Some((false, skipped)),
            v1::BadDataPolicy::Warn => Some((true, skipped)),
        };
        let batches = match shape.shuffle {
            None => {
                let read = read_split(assignment, split, split.first_row + start, end - start);
                read_covered(source, read, start, skipping)
            }
            Some(shuffle) => {
                let rows =
                    u32::try_from(split.row_count).map_err(|_| FeedError::TooLargeToShuffle {
                        task_id: assignment.task_id,
                        rows: split.row_count,
                    })?;
                let read = read_split(assignment, split, split.first_row, split.row_count);
                let whole: Vec<SplitBatch> = read_covered(source, read, 0, skipping)
                    .collect::<Vec<_>>()
                    .await
                    .into_iter()
                    .collect::<Result<_, _>>()?;
                let order =
                    split_order(rows, shuffle.seed, assignment.epoch, assignment.split_index);
                let permuted =
                    permute(&whole, &order, start, end, shape.batch_rows, &source.schema)?;
                stream::iter(permuted.into_iter().map(Ok)).boxed()
            }
        };
        Ok(Self {
            batches,
            transforms: shape.transforms.clone(),
            batcher: Batcher::new(shape.fixed_batch_size.then_some(shape.batch_rows)),
            ready: VecDeque::new(),
            done: false,
        })
    }

    /// The next batch, or `None` once the task's rows are all handed out. Reading stops at the batch
    /// that reaches `limit`, the row the task stops at (its end, or a stop row).
    pub(crate) async fn next(
        &mut self,
        limit: u64,
        stages: &Stages,
    ) -> Result<Option<SplitBatch>, FeedError> {
        loop {
            if let Some(ready) = self.ready.pop_front() {
                stages
                    .transform
                    .out(ready.batch.num_rows(), batch_bytes(&ready.batch));
                return Ok(Some(ready));
            }
            if self.done {
                return Ok(None);
            }
            let reading = Instant::now();
            let read = self.batches.next().await;
            stages.read.busy(reading.elapsed());
            let covered = match read {
                Some(covered) => covered?,
                None => {
                    self.done = true;
                    self.ready.extend(self.batcher.finish()?);
                    continue;
                }
            };
            stages
                .read
                .out(covered.batch.num_rows(), batch_bytes(&covered.batch));
            let transforming = Instant::now();
            let covered = if self.transforms.is_empty() {
                covered
            } else {
                let transformed = self.transforms.apply(covered.batch.clone())?;
                covered.with_batch(transformed)?
            };
            let reached = covered.end() >= limit;
            self.ready.extend(self.batcher.push(covered)?);
            if reached {
                self.done = true;
                self.ready.extend(self.batcher.finish()?);
            }
            stages.transform.busy(transforming.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch};
    use std::sync::Arc;

    /// Batches of `sizes` rows read from a split whose row `r` has id `r`, with the rows whose id is
    /// a multiple of 3 filtered out.
    fn filtered_reads(sizes: &[u64]) -> Vec<SplitBatch> {
        let mut first = 0u64;
        sizes
            .iter()
            .map(|size| {
                let ids: Vec<i64> = (first as i64..(first + size) as i64).collect();
                let mask = BooleanArray::from(ids.iter().map(|id| id % 3 != 0).collect::<Vec<_>>());
                let batch = RecordBatch::try_from_iter([(
                    "id",
                    Arc::new(Int64Array::from(ids)) as ArrayRef,
                )])
                .expect("batch");
                let covered = SplitBatch::new(batch, first, *size, None).expect("covered");
                first += size;
                covered.filter(&mask).expect("filters")
            })
            .collect()
    }

    fn ids(covered: &SplitBatch) -> Vec<i64> {
        covered
            .batch
            .column(0)
            .as_primitive::<arrow::datatypes::Int64Type>()
            .values()
            .to_vec()
    }

    fn run(batcher: &mut Batcher, reads: Vec<SplitBatch>) -> Vec<SplitBatch> {
        let mut out = Vec::new();
        for covered in reads {
            out.extend(batcher.push(covered).expect("pushes"));
        }
        out.extend(batcher.finish().expect("finishes"));
        out
    }

    #[test]
    fn fixed_batches_hold_exactly_the_size_and_tile_the_task() {
        let reads = filtered_reads(&[7, 1, 3, 20, 2, 9]);
        let expected: Vec<i64> = (0..42).filter(|id| id % 3 != 0).collect();
        let out = run(&mut Batcher::new(Some(5)), reads);
        let (last, full) = out.split_last().expect("batches");
        assert!(full.iter().all(|covered| covered.batch.num_rows() == 5));
        assert!(last.batch.num_rows() <= 5);
        let mut next = 0;
        for covered in &out {
            assert_eq!(covered.first_row, next, "batches follow one another");
            let positions: Vec<i64> = covered.positions().iter().map(|row| *row as i64).collect();
            assert_eq!(positions, ids(covered), "a row's position is its split row");
            next = covered.end();
        }
        assert_eq!(next, 42);
        assert_eq!(out.iter().flat_map(ids).collect::<Vec<_>>(), expected);
    }

    #[test]
    fn the_pieces_of_a_cut_batch_hold_its_bytes_once() {
        // Reads of 400 rows (266 or 267 after the filter) cut into batches of 100: each piece
        // shares the buffers of the batch it was cut from.
        let out = run(
            &mut Batcher::new(Some(100)),
            filtered_reads(&[400, 400, 200]),
        );
        let whole: usize = out
            .iter()
            .map(|covered| covered.batch.num_rows())
            .sum::<usize>()
            * 8;
        let counted: usize = out.iter().map(|covered| batch_bytes(&covered.batch)).sum();
        assert_eq!(counted, whole, "8 bytes per id, every id once");
        let shared: usize = out
            .iter()
            .map(|covered| covered.batch.get_array_memory_size())
            .sum();
        assert!(
            shared > 2 * whole,
            "the whole buffers, counted by each piece: {shared}"
        );
    }

    #[test]
    fn without_a_fixed_size_empty_batches_join_the_next_one() {
        let reads = filtered_reads(&[1, 1, 1, 2, 1]);
        // ids 0 | 1 | 2 | 3,4 | 5: the first read is empty after the filter.
        let out = run(&mut Batcher::new(None), reads);
        let shapes: Vec<(u64, u64, usize)> = out
            .iter()
            .map(|covered| {
                (
                    covered.first_row,
                    covered.row_count,
                    covered.batch.num_rows(),
                )
            })
            .collect();
        assert_eq!(shapes, vec![(0, 2, 1), (2, 1, 1), (3, 2, 1), (5, 1, 1)]);
    }
}

//! Exact coverage: which rows of a split each batch of a read accounts for.
//!
//! A read of a split yields [`SplitBatch`]es whose row ranges tile the split: the first starts at row 0
//! of the split, each starts where the one before ended, and the last ends at the split's row count.
//! Rows that a deletion vector, a pruned row group or page, or the filter removed lie inside the range
//! of some batch, possibly an empty one. A batch also knows which of its covered rows it holds, so it
//! can be cut at any split row: that is what makes "stop at row k" exact when a filter or a deletion
//! vector is in play.

use arrow::array::{Array, BooleanArray, RecordBatch};
use arrow::buffer::{BooleanBuffer, NullBuffer};
use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use futures::stream::{self, BoxStream, StreamExt};
use std::sync::Arc;

use crate::error::{FormatError, Result};

/// Rows of a split read, with the contiguous range of split rows they account for.
#[derive(Debug, Clone)]
pub struct SplitBatch {
    /// The rows, in split order.
    pub batch: RecordBatch,
    /// The first split row covered, counted from the start of the split.
    pub first_row: u64,
    /// The number of split rows covered; at least `batch.num_rows()`.
    pub row_count: u64,
    /// One bit per covered row, set for the rows `batch` holds; `None` when it holds every covered row.
    present: Option<BooleanBuffer>,
}

impl SplitBatch {
    /// Rows covering `[first_row, first_row + row_count)`; `present` marks the covered rows that are in
    /// `batch` (`None`: all of them).
    ///
    /// # Errors
    ///
    /// Returns [`FormatError::InvalidArgument`] when the rows and the coverage disagree.
    pub fn new(
        batch: RecordBatch,
        first_row: u64,
        row_count: u64,
        present: Option<BooleanBuffer>,
    ) -> Result<Self> {
        let held = batch.num_rows() as u64;
        let consistent = match &present {
            None => held == row_count,
            Some(bits) => bits.len() as u64 == row_count && bits.count_set_bits() as u64 == held,
        };
        if !consistent {
            return Err(FormatError::InvalidArgument(format!(
                "a batch of {held} rows cannot cover split rows [{first_row}, +{row_count}) with {} marked present",
                present
                    .as_ref()
                    .map_or(row_count, |bits| bits.count_set_bits() as u64)
            )));
        }
        let present = present.filter(|bits| bits.count_set_bits() != bits.len());
        Ok(Self {
            batch,
            first_row,
            row_count,
            present,
        })
    }

    /// No rows, covering `[first_row, first_row + row_count)`.
    pub fn empty(schema: SchemaRef, first_row: u64, row_count: u64) -> Self {
        Self {
            batch: RecordBatch::new_empty(schema),
            first_row,
            row_count,
            present: (row_count > 0).then(|| BooleanBuffer::new_unset(to_usize(row_count))),
        }
    }

    /// The split row after the last one covered.
    pub fn end(&self) -> u64 {
        self.first_row + self.row_count
    }

    /// The split row of each row of the batch, in order.
    pub fn positions(&self) -> Vec<u64> {
        match &self.present {
            None => (self.first_row..self.end()).collect(),
            Some(bits) => bits
                .set_indices()
                .map(|index| self.first_row + index as u64)
                .collect(),
        }
    }

    /// Replaces the rows with `batch`, which must hold as many rows (a transform of them).
    ///
    /// # Errors
    ///
    /// Returns [`FormatError::InvalidArgument`] when the row counts differ.
    pub fn with_batch(self, batch: RecordBatch) -> Result<Self> {
        if batch.num_rows() != self.batch.num_rows() {
            return Err(FormatError::InvalidArgument(format!(
                "a transform turned {} rows into {}; it must keep the row count",
                self.batch.num_rows(),
                batch.num_rows()
            )));
        }
        Ok(Self { batch, ..self })
    }

    /// Keeps only the batch rows for which `mask` is true (null counts as false), with the same
    /// coverage: the rows dropped stay covered.
    ///
    /// # Errors
    ///
    /// Returns an error when the mask's length is not the batch's row count.
    pub fn filter(self, mask: &BooleanArray) -> Result<Self> {
        if mask.len() != self.batch.num_rows() {
            return Err(FormatError::InvalidArgument(format!(
                "a filter mask of {} rows for a batch of {}",
                mask.len(),
                self.batch.num_rows()
            )));
        }
        let kept = true_bits(mask);
        if kept.count_set_bits() == kept.len() {
            return Ok(self);
        }
        let batch = arrow::compute::filter_record_batch(
            &self.batch,
            &BooleanArray::new(kept.clone(), None),
        )
        .map_err(|error| FormatError::arrow("filtering a split batch", error))?;
        let mut bits = arrow::array::BooleanBufferBuilder::new(to_usize(self.row_count));
        match &self.present {
            None => bits.append_buffer(&kept),
            Some(present) => {
                let mut kept_bits = kept.iter();
                for is_present in present.iter() {
                    bits.append(is_present && kept_bits.next().unwrap_or(false));
                }
            }
        }
        Self::new(batch, self.first_row, self.row_count, Some(bits.finish()))
    }

    /// Cuts the coverage at split row `row`: the first part covers `[first_row, row)` and holds the rows
    /// before `row`, the second the rest.
    ///
    /// # Errors
    ///
    /// Returns [`FormatError::InvalidArgument`] when `row` is outside the coverage.
    pub fn split_at_row(self, row: u64) -> Result<(Self, Self)> {
        if row < self.first_row || row > self.end() {
            return Err(FormatError::InvalidArgument(format!(
                "split row {row} is outside the batch's rows [{}, {})",
                self.first_row,
                self.end()
            )));
        }
        let offset = to_usize(row - self.first_row);
        let rows_before = match &self.present {
            None => offset,
            Some(bits) => bits.slice(0, offset).count_set_bits(),
        };
        Ok(self.cut(offset, rows_before))
    }

    /// Cuts after the first `rows` rows of the batch: the first part holds them and ends at the split row
    /// of the next row (rows removed in between go to the second part), or takes the whole coverage when
    /// `rows` is every row.
    ///
    /// # Errors
    ///
    /// Returns [`FormatError::InvalidArgument`] when the batch has fewer than `rows` rows.
    pub fn split_at_rows(self, rows: usize) -> Result<(Self, Self)> {
        let held = self.batch.num_rows();
        if rows > held {
            return Err(FormatError::InvalidArgument(format!(
                "cannot take {rows} rows of a batch of {held}"
            )));
        }
        let offset = if rows == held {
            to_usize(self.row_count)
        } else {
            match &self.present {
                None => rows,
                Some(bits) => bits.set_indices().nth(rows).unwrap_or(bits.len()),
            }
        };
        Ok(self.cut(offset, rows))
    }

    /// Splits the coverage at `offset` covered rows, of which `rows_before` are held.
    fn cut(self, offset: usize, rows_before: usize) -> (Self, Self) {
        let held = self.batch.num_rows();
        let row_count = to_usize(self.row_count);
        let slice_bits = |from: usize, length: usize| {
            self.present
                .as_ref()
                .map(|bits| bits.slice(from, length))
                .filter(|bits| bits.count_set_bits() != bits.len())
        };
        let head = Self {
            batch: self.batch.slice(0, rows_before),
            first_row: self.first_row,
            row_count: offset as u64,
            present: slice_bits(0, offset),
        };
        let tail = Self {
            batch: self.batch.slice(rows_before, held - rows_before),
            first_row: self.first_row + offset as u64,
            row_count: (row_count - offset) as u64,
            present: slice_bits(offset, row_count - offset),
        };
        (head, tail)
    }

    /// Joins batches whose coverages follow one another into one.
    ///
    /// # Errors
    ///
    /// Returns [`FormatError::InvalidArgument`] when `parts` is empty or leaves a gap, and an Arrow error
    /// when the schemas differ.
    pub fn concat(parts: &[Self]) -> Result<Self> {
        let first = parts
            .first()
            .ok_or_else(|| FormatError::InvalidArgument("joining no split batches".to_string()))?;
        if let [only] = parts {
            return Ok(only.clone());
        }
        let mut end = first.first_row;
        for part in parts {
            if part.first_row != end {
                return Err(FormatError::InvalidArgument(format!(
                    "split batches [{}, {}) and [{}, {}) do not follow one another",
                    first.first_row,
                    end,
                    part.first_row,
                    part.end()
                )));
            }
            end = part.end();
        }
        let mut holding = parts.iter().filter(|part| part.batch.num_rows() > 0);
        // Empty parts only add coverage: a lone batch with rows is kept as it is, without a copy.
        let batch = match (holding.next(), holding.next()) {
            (None, _) => first.batch.clone(),
            (Some(only), None) => only.batch.clone(),
            (Some(_), Some(_)) => {
                concat_batches(&first.batch.schema(), parts.iter().map(|part| &part.batch))
                    .map_err(|error| FormatError::arrow("joining split batches", error))?
            }
        };
        let row_count = end - first.first_row;
        let present = parts.iter().any(|part| part.present.is_some()).then(|| {
            let mut bits = arrow::array::BooleanBufferBuilder::new(to_usize(row_count));
            for part in parts {
                match &part.present {
                    Some(present) => bits.append_buffer(present),
                    None => bits.append_n(to_usize(part.row_count), true),
                }
            }
            bits.finish()
        });
        Self::new(batch, first.first_row, row_count, present)
    }
}

/// The rows of a filter result that are true and not null.
pub(crate) fn true_bits(mask: &BooleanArray) -> BooleanBuffer {
    match mask.nulls().map(NullBuffer::inner) {
        Some(valid) => mask.values() & valid,
        None => mask.values().clone(),
    }
}

fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// Tracks the split rows a decoder's output comes from, for a decoder that yields the rows of a list of
/// selected runs in order, and turns each decoded batch into a [`SplitBatch`] whose coverage starts where
/// the previous one ended.
#[derive(Debug)]
pub(crate) struct Coverage {
    /// Selected runs of split rows, `(first row, rows)`, in order.
    runs: std::collections::VecDeque<(u64, u64)>,
    /// The end of the coverage handed out so far.
    covered_end: u64,
    /// The split's row count.
    split_rows: u64,
}

impl Coverage {
    /// Coverage of a split of `split_rows` rows whose decoder yields the rows of `runs` in order.
    pub(crate) fn new(runs: impl IntoIterator<Item = (u64, u64)>, split_rows: u64) -> Self {
        Self {
            runs: runs.into_iter().filter(|(_, rows)| *rows > 0).collect(),
            covered_end: 0,
            split_rows,
        }
    }

    /// The coverage of the next `decoded` rows: from the end of the previous batch to the row after the
    /// last one decoded, and which covered rows were decoded.
    pub(crate) fn take(
        &mut self,
        decoded: usize,
        context: &str,
    ) -> Result<(u64, u64, Option<BooleanBuffer>)> {
        let first_row = self.covered_end;
        let mut left = decoded as u64;
        let mut pieces: Vec<(u64, u64)> = Vec::new();
        while left > 0 {
            let Some(run) = self.runs.front_mut() else {
                return Err(FormatError::InvalidArgument(format!(
                    "{context}: the decoder returned more rows than the split selects"
                )));
            };
            let take = run.1.min(left);
            pieces.push((run.0, take));
            run.0 += take;
            run.1 -= take;
            left -= take;
            if run.1 == 0 {
                self.runs.pop_front();
            }
        }
        let end = pieces
            .last()
            .map_or(first_row, |(start, rows)| start + rows);
        self.covered_end = end;
        let row_count = end - first_row;
        let contiguous =
            pieces.len() <= 1 && pieces.first().is_none_or(|(start, _)| *start == first_row);
        if contiguous {
            return Ok((first_row, row_count, None));
        }
        let mut bits = arrow::array::BooleanBufferBuilder::new(to_usize(row_count));
        let mut cursor = first_row;
        for (start, rows) in pieces {
            bits.append_n(to_usize(start - cursor), false);
            bits.append_n(to_usize(rows), true);
            cursor = start + rows;
        }
        Ok((first_row, row_count, Some(bits.finish())))
    }

    /// The first split row that was selected and not decoded yet, if any: once the decoder is done,
    /// a row its pages never held.
    pub(crate) fn undelivered(&self) -> Option<u64> {
        self.runs.front().map(|(first_row, _)| *first_row)
    }

    /// The empty batch that covers what is left of the split once the decoder is done, if anything is.
    pub(crate) fn rest(&self, schema: SchemaRef) -> Option<SplitBatch> {
        (self.covered_end < self.split_rows).then(|| {
            SplitBatch::empty(schema, self.covered_end, self.split_rows - self.covered_end)
        })
    }
}

/// Turns a decoder's batches into finished [`SplitBatch`]es whose coverages tile the split: each decoded
/// batch is given its coverage from `coverage`, then `finish` (filter, projection) runs on it, and an empty
/// batch of `schema` covers whatever the decoder never reached (pruned row groups or pages at the end).
///
/// A decoder that ends before the rows it was to yield (pages that hold fewer rows than the footer
/// claims) ends the stream with the error `short` makes of the first split row it never yielded: those
/// rows do not exist, so nothing covers them as read.
pub(crate) fn covered_stream(
    decoded: BoxStream<'static, Result<RecordBatch>>,
    coverage: Coverage,
    schema: SchemaRef,
    context: String,
    finish: impl FnMut(SplitBatch) -> Result<SplitBatch> + Send + 'static,
    short: impl Fn(u64) -> FormatError + Send + Sync + 'static,
) -> BoxStream<'static, Result<SplitBatch>> {
    let state = (Some(decoded), coverage, finish);
    let short = Arc::new(short);
    stream::unfold(state, move |(decoded, mut coverage, mut finish)| {
        let schema = Arc::clone(&schema);
        let context = context.clone();
        let short = Arc::clone(&short);
        async move {
            let mut decoded = decoded?;
            match decoded.next().await {
                Some(Ok(batch)) => {
                    let rows = batch.num_rows();
                    let result = coverage
                        .take(rows, &context)
                        .and_then(|(first_row, row_count, present)| {
                            SplitBatch::new(batch, first_row, row_count, present)
                        })
                        .and_then(&mut finish);
                    Some((result, (Some(decoded), coverage, finish)))
                }
                Some(Err(error)) => Some((Err(error), (None, coverage, finish))),
                None => match coverage.undelivered() {
                    Some(row) => Some((Err(short(row)), (None, coverage, finish))),
                    None => coverage
                        .rest(schema)
                        .map(|rest| (Ok(rest), (None, coverage, finish))),
                },
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};

    fn ids(values: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values.to_vec()))])
            .expect("batch")
    }

    fn bits(pattern: &[bool]) -> BooleanBuffer {
        BooleanBuffer::from(pattern.to_vec())
    }

    #[test]
    fn coverage_tiles_runs_and_marks_the_gaps() {
        let mut sut = Coverage::new([(2, 3), (7, 2)], 12);
        let (first, count, present) = sut.take(2, "test").expect("rows");
        assert_eq!((first, count), (0, 4));
        assert_eq!(
            present.expect("gap").iter().collect::<Vec<_>>(),
            [false, false, true, true]
        );
        let (first, count, present) = sut.take(3, "test").expect("rows");
        assert_eq!((first, count), (4, 5));
        assert_eq!(
            present.expect("gap").iter().collect::<Vec<_>>(),
            [true, false, false, true, true]
        );
        let rest = sut.rest(ids(&[]).schema()).expect("rest");
        assert_eq!(
            (rest.first_row, rest.row_count, rest.batch.num_rows()),
            (9, 3, 0)
        );
        assert!(
            sut.take(1, "test").is_err(),
            "more rows than selected is an error"
        );
    }

    #[test]
    fn cutting_at_a_row_keeps_the_rows_before_it() {
        let sut = SplitBatch::new(
            ids(&[10, 12, 15]),
            10,
            6,
            Some(bits(&[true, false, true, false, false, true])),
        )
        .expect("consistent");
        assert_eq!(sut.positions(), vec![10, 12, 15]);
        let (head, tail) = sut.clone().split_at_row(14).expect("inside");
        assert_eq!((head.first_row, head.row_count), (10, 4));
        assert_eq!(head.positions(), vec![10, 12]);
        assert_eq!((tail.first_row, tail.row_count), (14, 2));
        assert_eq!(tail.positions(), vec![15]);
        let (head, tail) = sut.clone().split_at_rows(1).expect("rows");
        assert_eq!(
            (head.first_row, head.row_count, head.batch.num_rows()),
            (10, 2, 1)
        );
        assert_eq!(tail.positions(), vec![12, 15]);
        let joined = SplitBatch::concat(&[head, tail]).expect("adjacent");
        assert_eq!(joined.positions(), vec![10, 12, 15]);
        assert_eq!((joined.first_row, joined.row_count), (10, 6));
        assert!(sut.split_at_row(17).is_err());
    }

    #[test]
    fn filtering_keeps_the_coverage() {
        let sut = SplitBatch::new(ids(&[0, 1, 2, 3]), 0, 4, None).expect("consistent");
        let mask = BooleanArray::from(vec![Some(true), None, Some(false), Some(true)]);
        let filtered = sut.filter(&mask).expect("filters");
        assert_eq!((filtered.first_row, filtered.row_count), (0, 4));
        assert_eq!(filtered.positions(), vec![0, 3]);
        assert!(
            SplitBatch::new(ids(&[1]), 0, 2, None).is_err(),
            "rows and coverage disagree"
        );
    }
}

//! The daemon's two levels of the shuffle (`data.shuffle`): a row permutation within each task, and
//! the interleave of the open tasks of a ring. The third level, the order of the tasks of an epoch,
//! is the AM's.
//!
//! # Implementation
//! A task's rows come out in its split's *delivery order*: order position `p` of the split holds
//! split row `permutation[p]`, where `permutation` is a Fisher-Yates shuffle of `0..rows` seeded by
//! `(job seed, epoch, split index)`. The task `[start, end)` delivers the rows of order positions
//! `start..end`, and every count (a batch's first row and row count, consumed, stop at k) is in order
//! positions. A re-split piece `[k, end)` on another daemon reads the whole split, permutes it the
//! same way and keeps positions `k..end`, so the two pieces deliver each row of the task once. The
//! seed takes the split rather than the task id so that several tasks cut from one split partition
//! its one permutation.
//!
//! Rows a filter or a deletion vector removed keep their order positions: a batch covers a range of
//! positions, some of them empty, as a read of the split in file order does.
//!
//! The generator is SplitMix64, written out as in the AM's task order: the permutation of a given
//! seed must never change with a dependency's version, or a checkpoint could not resume into it.

use arrow::array::UInt32Array;
use arrow::buffer::BooleanBuffer;
use arrow::compute::{concat_batches, take_record_batch};
use arrow::datatypes::SchemaRef;
use sluice_formats::SplitBatch;

use crate::error::FeedError;

/// SplitMix64: a small, fast generator whose output for a seed is fixed forever.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator for the stream named by `seed` and the words of `stream`.
    pub(crate) fn new(seed: u64, stream: &[u64]) -> Self {
        let mut generator = Self { state: seed };
        for word in stream {
            generator.state ^= generator.next() ^ word.wrapping_mul(0xD1B5_4A32_D192_ED03);
        }
        generator
    }

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut mixed = self.state;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        mixed ^ (mixed >> 31)
    }

    /// A value in `0..bound`, by multiply-shift; the bias is below 2^-32 for a bound under 2^32.
    pub(crate) fn below(&mut self, bound: u64) -> u64 {
        debug_assert!(bound > 0);
        ((u128::from(self.next()) * u128::from(bound)) >> 64) as u64
    }
}

/// The delivery order of a split of `rows` rows: position `p` holds split row `order[p]`.
pub(crate) fn split_order(rows: u32, seed: u64, epoch: u32, split_index: u32) -> Vec<u32> {
    let mut generator = SplitMix64::new(seed, &[u64::from(epoch), u64::from(split_index)]);
    let mut order: Vec<u32> = (0..rows).collect();
    for index in (1..order.len()).rev() {
        let other = generator.below(index as u64 + 1) as usize;
        order.swap(index, other);
    }
    order
}

/// Puts the rows of a whole split, read in split order, into its delivery order and keeps the
/// positions `[start, end)`, as batches of at most `batch_rows` rows that cover `[start, end)`.
///
/// `read` are the batches of the read of the whole split, their coverage counted from the split's
/// first row; `order` is [`split_order`] of the split.
pub(crate) fn permute(
    read: &[SplitBatch],
    order: &[u32],
    start: u64,
    end: u64,
    batch_rows: usize,
    schema: &SchemaRef,
) -> Result<Vec<SplitBatch>, FeedError> {
    let mut position_of_row = vec![0u32; order.len()];
    for (position, row) in order.iter().enumerate() {
        position_of_row[*row as usize] = position as u32;
    }
    let mut keyed: Vec<(u32, u32)> = Vec::new();
    let mut row_index = 0u32;
    for covered in read {
        for split_row in covered.positions() {
            let position =
                *position_of_row
                    .get(split_row as usize)
                    .ok_or(FeedError::RowOutsideSplit {
                        row: split_row,
                        rows: order.len(),
                    })?;
            if (start..end).contains(&u64::from(position)) {
                keyed.push((position, row_index));
            }
            row_index += 1;
        }
    }
    keyed.sort_unstable();
    let rows = concat_batches(schema, read.iter().map(|covered| &covered.batch))
        .map_err(FeedError::Join)?;
    let mut output = Vec::new();
    let mut covered_end = start;
    let chunks: Vec<&[(u32, u32)]> = keyed.chunks(batch_rows.max(1)).collect();
    for (chunk_index, chunk) in chunks.iter().enumerate() {
        let last = chunk_index + 1 == chunks.len();
        let chunk_end = if last {
            end
        } else {
            chunk
                .last()
                .map_or(covered_end, |(position, _)| u64::from(*position) + 1)
        };
        let indices = UInt32Array::from_iter_values(chunk.iter().map(|(_, row)| *row));
        let batch = take_record_batch(&rows, &indices).map_err(FeedError::Order)?;
        let mut present = vec![false; (chunk_end - covered_end) as usize];
        for (position, _) in chunk.iter() {
            present[(u64::from(*position) - covered_end) as usize] = true;
        }
        let covered = SplitBatch::new(
            batch,
            covered_end,
            chunk_end - covered_end,
            Some(BooleanBuffer::from(present)),
        )?;
        output.push(covered);
        covered_end = chunk_end;
    }
    if covered_end < end {
        output.push(SplitBatch::empty(
            schema.clone(),
            covered_end,
            end - covered_end,
        ));
    }
    Ok(output)
}

/// The seeded choice of which open task of a ring gives the next batch.
#[derive(Debug, Clone)]
pub(crate) struct Interleave {
    generator: SplitMix64,
}

impl Interleave {
    /// The interleave of `epoch`.
    pub(crate) fn new(seed: u64, epoch: u32) -> Self {
        Self {
            generator: SplitMix64::new(seed, &[u64::from(epoch), u64::MAX]),
        }
    }

    /// Picks one of `open` tasks.
    pub(crate) fn pick(&mut self, open: usize) -> usize {
        if open <= 1 {
            return 0;
        }
        self.generator.below(open as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, Int64Array, RecordBatch};
    use std::sync::Arc;

    fn ids_of(batches: &[SplitBatch]) -> Vec<i64> {
        use arrow::array::AsArray;
        batches
            .iter()
            .flat_map(|covered| {
                covered
                    .batch
                    .column(0)
                    .as_primitive::<arrow::datatypes::Int64Type>()
                    .values()
                    .to_vec()
            })
            .collect()
    }

    /// A read of a split of `rows` rows whose row `r` has id `r`, less the rows in `removed`, in
    /// batches of 4.
    fn read(rows: u64, removed: &[u64]) -> (Vec<SplitBatch>, SchemaRef) {
        let ids: Vec<i64> = (0..rows as i64).collect();
        let batch =
            RecordBatch::try_from_iter([("id", Arc::new(Int64Array::from(ids)) as ArrayRef)])
                .expect("batch");
        let schema = batch.schema();
        let mut batches = Vec::new();
        let mut first = 0u64;
        while first < rows {
            let count = 4.min(rows - first);
            let piece = SplitBatch::new(
                batch.slice(first as usize, count as usize),
                first,
                count,
                None,
            )
            .expect("covered");
            let mask = arrow::array::BooleanArray::from(
                (first..first + count)
                    .map(|row| !removed.contains(&row))
                    .collect::<Vec<bool>>(),
            );
            batches.push(piece.filter(&mask).expect("filters"));
            first += count;
        }
        (batches, schema)
    }

    #[test]
    fn the_order_is_fixed_by_seed_epoch_and_split() {
        assert_eq!(split_order(100, 7, 1, 3), split_order(100, 7, 1, 3));
        assert_ne!(split_order(100, 7, 0, 3), split_order(100, 7, 1, 3));
        assert_ne!(split_order(100, 7, 0, 3), split_order(100, 7, 0, 4));
        assert_ne!(split_order(100, 7, 0, 3), split_order(100, 8, 0, 3));
        let mut sorted = split_order(1000, 1, 2, 3);
        assert_ne!(sorted, (0..1000).collect::<Vec<u32>>());
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<u32>>());
        // Pinned so that a change to the generator, which would break resuming old checkpoints,
        // fails here.
        assert_eq!(split_order(8, 42, 3, 5), PINNED_ORDER_8_42_3_5.to_vec());
    }

    const PINNED_ORDER_8_42_3_5: [u32; 8] = [5, 7, 6, 0, 3, 4, 1, 2];

    #[test]
    fn permuted_pieces_deliver_each_kept_row_once_in_the_order() {
        let removed = [0, 5, 6, 7, 19, 22];
        let (batches, schema) = read(23, &removed);
        let order = split_order(23, 9, 1, 0);
        let whole = permute(&batches, &order, 0, 23, 5, &schema).expect("permutes");
        let expected: Vec<i64> = order
            .iter()
            .map(|row| i64::from(*row))
            .filter(|row| !removed.contains(&(*row as u64)))
            .collect();
        assert_eq!(ids_of(&whole), expected);
        let mut next = 0;
        for covered in &whole {
            assert_eq!(covered.first_row, next);
            assert!(covered.batch.num_rows() <= 5);
            let rows_of: Vec<i64> = covered
                .positions()
                .iter()
                .map(|position| i64::from(order[*position as usize]))
                .collect();
            assert_eq!(
                rows_of,
                ids_of(std::slice::from_ref(covered)),
                "positions are exact"
            );
            next = covered.end();
        }
        assert_eq!(next, 23);
        for stop in [0, 1, 9, 17, 23] {
            let head = permute(&batches, &order, 0, stop, 5, &schema).expect("head");
            let tail = permute(&batches, &order, stop, 23, 5, &schema).expect("tail");
            assert_eq!(head.last().map_or(0, SplitBatch::end), stop);
            assert_eq!(tail.first().map_or(23, |covered| covered.first_row), stop);
            let mut joined = ids_of(&head);
            joined.extend(ids_of(&tail));
            assert_eq!(joined, expected, "stop at {stop}");
        }
    }

    #[test]
    fn the_interleave_is_seeded_by_epoch() {
        let picks = |epoch| {
            let mut sut = Interleave::new(5, epoch);
            (0..64).map(|_| sut.pick(4)).collect::<Vec<usize>>()
        };
        assert_eq!(picks(0), picks(0));
        assert_ne!(picks(0), picks(1));
        assert!(picks(0).iter().all(|pick| *pick < 4));
        assert_eq!(Interleave::new(5, 0).pick(1), 0);
    }
}

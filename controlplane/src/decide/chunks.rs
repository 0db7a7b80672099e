//! A vector in fixed-size chunks shared copy-on-write, so that the task table can be captured for a
//! snapshot in reference-count increments while it keeps changing.
//!
//! # Implementation
//! Elements live in chunks of [`CHUNK`] elements, each behind an [`Arc`]; every chunk but the last
//! is full, so element `i` is element `i % CHUNK` of chunk `i / CHUNK`. Cloning copies the list of
//! chunk pointers only. A write goes through [`Arc::make_mut`], which copies the chunk first when
//! a clone still shares it: after a snapshot is captured, the first write to each chunk copies that
//! chunk (6 KiB of task slots), and writes after that cost what they cost before.

use std::ops::{Index, IndexMut};
use std::sync::Arc;

/// Elements per chunk: a power of two, so that an index splits with a shift and a mask. Small, because
/// the tasks a job has in flight are spread over the whole table when it shuffles: after a capture,
/// the heartbeats that follow copy nearly every chunk they write to, and with chunks of 4,096 slots
/// the first 0.3 s after a capture of ten million tasks copied 229 MiB on the thread that
/// answers the daemons. Chunks of 256 slots spread the copies over the heartbeats, a few KiB each;
/// a ten million task table is then 39,063 chunks of slots, captured in about as many reference
/// count increments under the master's lock.
const CHUNK_BITS: u32 = 8;
const CHUNK: usize = 1 << CHUNK_BITS;
const CHUNK_MASK: usize = CHUNK - 1;

/// A growable vector whose clones share its chunks until either side writes to one.
#[derive(Clone, Default, PartialEq, Eq)]
pub(super) struct ChunkedVec<T> {
    chunks: Vec<Arc<Vec<T>>>,
    len: usize,
}

impl<T: Clone> ChunkedVec<T> {
    pub(super) fn new() -> ChunkedVec<T> {
        ChunkedVec {
            chunks: Vec::new(),
            len: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn get(&self, index: usize) -> Option<&T> {
        (index < self.len).then(|| &self.chunks[index >> CHUNK_BITS][index & CHUNK_MASK])
    }

    pub(super) fn push(&mut self, value: T) {
        if self.len & CHUNK_MASK == 0 {
            let mut chunk = Vec::with_capacity(CHUNK);
            chunk.push(value);
            self.chunks.push(Arc::new(chunk));
        } else {
            let last = self
                .chunks
                .last_mut()
                .expect("a vector whose length is not a multiple of the chunk has a last chunk");
            Arc::make_mut(last).push(value);
        }
        self.len += 1;
    }

    /// Frees the spare capacity of the last chunk and of the list of chunks, once the vector is
    /// built whole.
    pub(super) fn shrink_to_fit(&mut self) {
        if let Some(last) = self.chunks.last_mut() {
            Arc::make_mut(last).shrink_to_fit();
        }
        self.chunks.shrink_to_fit();
    }

    /// The elements from `start` on, in order; none when `start` is past the end.
    pub(super) fn iter_from(&self, start: usize) -> impl Iterator<Item = &T> + '_ {
        let start = start.min(self.len);
        let (first_chunk, skip) = (start >> CHUNK_BITS, start & CHUNK_MASK);
        self.chunks
            .get(first_chunk..)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .flat_map(move |(index, chunk)| {
                let from = if index == 0 { skip } else { 0 };
                chunk[from..].iter()
            })
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.iter_from(0)
    }

    /// The bytes the elements' chunks hold, counted at their capacity, and the chunk pointers.
    pub(super) fn memory_bytes(&self) -> usize {
        let elements: usize = self.chunks.iter().map(|chunk| chunk.capacity()).sum();
        elements * std::mem::size_of::<T>()
            + self.chunks.capacity() * std::mem::size_of::<Arc<Vec<T>>>()
    }
}

impl<T: Clone> Extend<T> for ChunkedVec<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, values: I) {
        for value in values {
            self.push(value);
        }
    }
}

impl<T: Clone> FromIterator<T> for ChunkedVec<T> {
    fn from_iter<I: IntoIterator<Item = T>>(values: I) -> ChunkedVec<T> {
        let mut vector = ChunkedVec::new();
        vector.extend(values);
        vector
    }
}

impl<T: Clone> Index<usize> for ChunkedVec<T> {
    type Output = T;

    fn index(&self, index: usize) -> &T {
        assert!(
            index < self.len,
            "index {index} out of a chunked vector of {}",
            self.len
        );
        &self.chunks[index >> CHUNK_BITS][index & CHUNK_MASK]
    }
}

impl<T: Clone> IndexMut<usize> for ChunkedVec<T> {
    /// Copies the element's chunk first when a clone shares it.
    fn index_mut(&mut self, index: usize) -> &mut T {
        assert!(
            index < self.len,
            "index {index} out of a chunked vector of {}",
            self.len
        );
        &mut Arc::make_mut(&mut self.chunks[index >> CHUNK_BITS])[index & CHUNK_MASK]
    }
}

impl<T: Clone + std::fmt::Debug> std::fmt::Debug for ChunkedVec<T> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_and_iteration_cross_chunk_boundaries() {
        let count = 3 * CHUNK + 5;
        let mut sut: ChunkedVec<u64> = (0..count as u64).collect();
        sut.shrink_to_fit();
        assert_eq!(sut.len(), count);
        for index in [0, CHUNK - 1, CHUNK, 2 * CHUNK + 1, count - 1] {
            assert_eq!(sut[index], index as u64);
            assert_eq!(sut.get(index), Some(&(index as u64)));
        }
        assert_eq!(sut.get(count), None);
        assert!(sut.iter().copied().eq(0..count as u64));
        assert_eq!(
            sut.memory_bytes(),
            count * 8 + 4 * std::mem::size_of::<Arc<Vec<u64>>>(),
            "no spare capacity once shrunk"
        );
        for start in [
            0,
            1,
            CHUNK - 1,
            CHUNK,
            CHUNK + 7,
            count - 1,
            count,
            count + 9,
        ] {
            assert!(
                sut.iter_from(start)
                    .copied()
                    .eq(start.min(count) as u64..count as u64),
                "from {start}"
            );
        }
    }

    #[test]
    fn a_clone_keeps_its_elements_while_the_original_changes_and_grows() {
        let mut sut: ChunkedVec<u32> = (0..(2 * CHUNK) as u32).collect();
        let captured = sut.clone();
        assert!(
            Arc::ptr_eq(&sut.chunks[0], &captured.chunks[0]),
            "a clone shares the chunks"
        );
        sut[3] = 1_000_000;
        sut[CHUNK + 1] = 2_000_000;
        sut.push(7);
        assert!(captured.iter().copied().eq(0..(2 * CHUNK) as u32));
        assert_eq!(captured.len(), 2 * CHUNK);
        assert_eq!(
            (sut[3], sut[CHUNK + 1], sut[2 * CHUNK]),
            (1_000_000, 2_000_000, 7)
        );
        assert_eq!(sut.len(), 2 * CHUNK + 1);
        assert!(!Arc::ptr_eq(&sut.chunks[0], &captured.chunks[0]));
    }

    #[test]
    fn pushing_into_a_shared_last_chunk_leaves_the_clone_its_length() {
        let mut sut: ChunkedVec<u8> = (0..10).collect();
        let captured = sut.clone();
        sut.push(10);
        assert_eq!(captured.len(), 10);
        assert!(captured.iter().copied().eq(0..10));
        assert!(sut.iter().copied().eq(0..11));
    }
}

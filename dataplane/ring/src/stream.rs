//! Copies into the ring that go around the cache, for records the consumer will reach only after
//! the cache has let them go.
//!
//! A plain store to a line not in the cache first reads the line from memory (a read for
//! ownership), then writes it back: two passes over memory for one pass of data. A record written
//! far ahead of the consumer is evicted before the consumer reads it, so that read buys nothing. A
//! non-temporal store writes whole lines to memory without reading them. It is weakly ordered, so
//! the producer fences ([`fence`]) before it publishes a record written so.
//!
//! On x86_64, with SSE2 (part of the architecture). Elsewhere, and under Miri and loom, which
//! model plain memory only, [`STREAMS`] is false and the copy is a plain one.

/// Whether this build copies with non-temporal stores.
pub(crate) const STREAMS: bool = cfg!(all(target_arch = "x86_64", not(miri), not(loom)));

/// The smallest payload worth streaming: below it, the fence costs more than the reads it saves.
pub(crate) const STREAM_MIN_BYTES: u64 = 64 << 10;

/// How far ahead of the consumer (written but not yet released bytes) a record is streamed: the
/// consumer reads it only after reading this much, while the producer writes as much again, more
/// than the last-level cache of most machines keeps for one ring.
pub(crate) const STREAM_BACKLOG_BYTES: u64 = 16 << 20;

/// Copies `source` into `target`, of the same length, with non-temporal stores where [`STREAMS`]:
/// a plain copy up to the first 16-byte boundary of `target`, 64 bytes (a line) at a time after
/// it, and a plain copy of the rest. The caller calls [`fence`] before the bytes are published.
///
/// # Panics
/// If the lengths differ.
pub(crate) fn copy(target: &mut [u8], source: &[u8]) {
    assert_eq!(
        target.len(),
        source.len(),
        "a streamed copy between slices of different lengths"
    );
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        const LINE: usize = 64;
        const LANE: usize = 16;
        let head = target.as_ptr().align_offset(LANE).min(target.len());
        target[..head].copy_from_slice(&source[..head]);
        let lines = (target.len() - head) / LINE;
        let to = target[head..].as_mut_ptr();
        let from = source[head..].as_ptr();
        for line in 0..lines {
            for lane in 0..LINE / LANE {
                let at = line * LINE + lane * LANE;
                // SAFETY: `at + 16 <= lines * 64 <= target.len() - head`, and `source` is as long
                // as `target`, so both 16-byte ranges lie in their slices. `to + at` is 16-byte
                // aligned (`head` brings `to` to a 16-byte boundary and `at` is a multiple of 16),
                // as `_mm_stream_si128` requires; `_mm_loadu_si128` takes any alignment. SSE2 is
                // part of x86_64. The slices do not overlap: one is borrowed mutably.
                unsafe {
                    let value = _mm_loadu_si128(from.add(at).cast::<__m128i>());
                    _mm_stream_si128(to.add(at).cast::<__m128i>(), value);
                }
            }
        }
        let done = head + lines * LINE;
        target[done..].copy_from_slice(&source[done..]);
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri), not(loom))))]
    target.copy_from_slice(source);
}

/// Orders every non-temporal store before the stores that follow it, so that a consumer that sees
/// the write cursor published after it sees the streamed bytes too. Nothing where not [`STREAMS`].
pub(crate) fn fence() {
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    // SAFETY: `sfence` has no operands and no precondition beyond SSE, part of x86_64.
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_copy_equals_the_source_at_every_alignment_and_length() {
        let source: Vec<u8> = (0..4096u32).map(|index| (index % 251) as u8 + 1).collect();
        let mut buffer = vec![0u8; 4096 + 64];
        for offset in [0, 1, 7, 15, 16, 17, 63] {
            for len in [0, 1, 15, 16, 63, 64, 65, 127, 1000, 4031] {
                buffer.fill(0);
                copy(&mut buffer[offset..offset + len], &source[..len]);
                fence();
                assert_eq!(
                    &buffer[offset..offset + len],
                    &source[..len],
                    "{offset}, {len}"
                );
                assert!(
                    buffer[..offset].iter().all(|byte| *byte == 0),
                    "before, {offset}"
                );
                assert!(
                    buffer[offset + len..].iter().all(|byte| *byte == 0),
                    "after, {offset}, {len}"
                );
            }
        }
    }
}

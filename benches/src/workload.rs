//! The workload every transport runs: what the producer writes and what the consumer checks.
//!
//! The producer fills each record with one copy from a source buffer, as an encoder writing an Arrow IPC
//! message would, and stamps a sequence number into its first 8 bytes. The consumer reads one `u64` from
//! every 64-byte cache line of the record, as a trainer decoding it would, and checks the sequence number.

use std::hint::black_box;

use crate::error::{BenchError, Result};
use crate::transport::Transport;

/// The smallest record size: the sequence number takes the first 8 bytes.
pub const MIN_RECORD_SIZE: usize = 8;
/// The largest record size the suite accepts.
pub const MAX_RECORD_SIZE: usize = 256 << 20;
/// The sizes the suite runs when none are given: 64 B, 4 KiB, 64 KiB and 1 MiB.
pub const DEFAULT_SIZES: [usize; 4] = [64, 4 << 10, 64 << 10, 1 << 20];
/// The bytes of buffering each transport gets: the ring's capacity, and the depth of the queues of the
/// baselines. 8 MiB stays inside a server's last-level cache, as iceoryx2's recycled sample pool does
/// whatever its depth, so every transport is measured with its buffers cache-resident; a buffer larger
/// than the cache streams through DRAM and is bounded by the memcpy figure instead.
pub const QUEUE_BYTES: usize = 8 << 20;

const CACHE_LINE: usize = 64;

/// The bytes the producer copies into every record.
#[derive(Debug)]
pub struct Source {
    bytes: Vec<u8>,
}

impl Source {
    /// Builds the source of `size`-byte records, filled with a fixed non-zero pattern.
    pub fn new(size: usize) -> Source {
        let bytes = (0..size).map(|index| (index % 251) as u8 + 1).collect();
        Source { bytes }
    }

    /// The bytes of a record before its sequence number is stamped.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Fills `record` (exactly the source's size) with one copy of the source and stamps `sequence`.
    pub fn fill(&self, record: &mut [u8], sequence: u64) {
        record.copy_from_slice(&self.bytes);
        stamp(record, sequence);
    }
}

/// Writes `sequence` into the first 8 bytes of `record`.
pub fn stamp(record: &mut [u8], sequence: u64) {
    record[..8].copy_from_slice(&sequence.to_le_bytes());
}

/// Reads every record a consumer receives and checks that they arrive complete and in order.
#[derive(Debug)]
pub struct Checker {
    transport: Transport,
    size: usize,
    next_sequence: u64,
    sum: u64,
}

impl Checker {
    /// Starts checking a stream of `size`-byte records over `transport`.
    pub fn new(transport: Transport, size: usize) -> Checker {
        Checker {
            transport,
            size,
            next_sequence: 0,
            sum: 0,
        }
    }

    /// Reads one `u64` from every cache line of `record` and checks its length and sequence number.
    pub fn check(&mut self, record: &[u8]) -> Result<()> {
        if record.len() != self.size {
            return Err(self.corrupt(format!("a record of {} bytes", record.len())));
        }
        let sequence = record
            .first_chunk::<8>()
            .map(|head| u64::from_le_bytes(*head))
            .ok_or_else(|| self.corrupt("a record without a sequence number".to_owned()))?;
        if sequence != self.next_sequence {
            return Err(self.corrupt(format!("sequence number {sequence}")));
        }
        let mut sum = 0u64;
        for line in record.chunks(CACHE_LINE) {
            let word = match line.first_chunk::<8>() {
                Some(head) => u64::from_ne_bytes(*head),
                None => u64::from(line[0]),
            };
            sum = sum.wrapping_add(word);
        }
        self.sum = self.sum.wrapping_add(black_box(sum));
        self.next_sequence += 1;
        Ok(())
    }

    /// The number of records checked so far.
    pub fn received(&self) -> u64 {
        self.next_sequence
    }

    /// Fails unless exactly `expected` records were checked.
    pub fn finish(self, expected: u64) -> Result<()> {
        black_box(self.sum);
        if self.next_sequence == expected {
            Ok(())
        } else {
            Err(BenchError::ShortStream {
                transport: self.transport,
                expected,
                received: self.next_sequence,
            })
        }
    }

    fn corrupt(&self, found: String) -> BenchError {
        BenchError::Corrupt {
            transport: self.transport,
            size: self.size,
            expected_sequence: self.next_sequence,
            found,
        }
    }
}

/// Reads the system-wide monotonic clock in nanoseconds; comparable between processes, unlike `Instant`.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec, and CLOCK_MONOTONIC exists on every Linux kernel.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    debug_assert_eq!(status, 0);
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Parses a list of record sizes such as `64,4096,64KiB,1MiB`.
pub fn parse_sizes(list: &str) -> Result<Vec<usize>> {
    let sizes = list
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(parse_size)
        .collect::<Result<Vec<_>>>()?;
    if sizes.is_empty() {
        return Err(BenchError::InvalidSize {
            given: list.to_owned(),
            reason: "the list names no size".to_owned(),
        });
    }
    Ok(sizes)
}

fn parse_size(entry: &str) -> Result<usize> {
    let invalid = |reason: String| BenchError::InvalidSize {
        given: entry.to_owned(),
        reason,
    };
    let (digits, unit) = match entry.find(|character: char| !character.is_ascii_digit()) {
        Some(split) => entry.split_at(split),
        None => (entry, ""),
    };
    let multiplier: usize = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        other => {
            return Err(invalid(format!(
                "unknown unit {other:?} (use B, KiB or MiB)"
            )));
        }
    };
    let count: usize = digits
        .parse()
        .map_err(|_| invalid("not a whole number".to_owned()))?;
    let size = count
        .checked_mul(multiplier)
        .filter(|size| *size <= MAX_RECORD_SIZE)
        .ok_or_else(|| {
            invalid(format!(
                "larger than the maximum of {MAX_RECORD_SIZE} bytes"
            ))
        })?;
    if size < MIN_RECORD_SIZE {
        return Err(invalid(format!(
            "smaller than {MIN_RECORD_SIZE} bytes, the room for the sequence number"
        )));
    }
    Ok(size)
}

/// How many records of `size` bytes each queue of a baseline holds: [`QUEUE_BYTES`] worth, within 16..=1024.
pub fn queue_depth(size: usize) -> usize {
    (QUEUE_BYTES / size).clamp(16, 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checker_accepts_records_in_order_and_counts_them() {
        let source = Source::new(100);
        let mut sut = Checker::new(Transport::Crossbeam, 100);
        let mut record = vec![0u8; 100];
        for sequence in 0..3 {
            source.fill(&mut record, sequence);
            sut.check(&record).expect("record in order");
        }
        assert_eq!(sut.received(), 3);
        sut.finish(3).expect("all records arrived");
    }

    #[test]
    fn checker_rejects_a_skipped_record() {
        let source = Source::new(64);
        let mut sut = Checker::new(Transport::UnixSocket, 64);
        let mut record = vec![0u8; 64];
        source.fill(&mut record, 1);
        let error = sut.check(&record).expect_err("sequence 1 before 0");
        assert!(error.to_string().contains("sequence number 1"), "{error}");
    }

    #[test]
    fn checker_rejects_a_record_of_the_wrong_length() {
        let mut sut = Checker::new(Transport::SluiceRing, 64);
        let error = sut.check(&[0u8; 72]).expect_err("72 bytes, not 64");
        assert!(error.to_string().contains("72 bytes"), "{error}");
    }

    #[test]
    fn checker_reports_a_short_stream() {
        let sut = Checker::new(Transport::Iceoryx2, 64);
        let error = sut.finish(5).expect_err("nothing arrived");
        assert!(error.to_string().contains("after 0 of 5"), "{error}");
    }

    #[test]
    fn sizes_parse_with_units() {
        let sizes = parse_sizes("64, 4096,64KiB,1MiB,2K").expect("valid sizes");
        assert_eq!(sizes, vec![64, 4096, 65536, 1 << 20, 2048]);
    }

    #[test]
    fn sizes_reject_bad_entries_with_the_fix() {
        for bad in ["", "4", "12GiB", "x", "1024MiB", "-8"] {
            let error = parse_sizes(bad).expect_err(bad);
            assert!(error.to_string().contains("--sizes"), "{bad}: {error}");
        }
    }

    #[test]
    fn queue_depth_stays_within_bounds() {
        assert_eq!(queue_depth(64), 1024);
        assert_eq!(queue_depth(64 << 10), QUEUE_BYTES / (64 << 10));
        assert_eq!(queue_depth(1 << 20), 16);
        assert_eq!(queue_depth(16 << 20), 16);
    }
}

//! Single-thread memcpy bandwidth: the ceiling a transport that copies each record once is held to.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// The size of each of the two buffers: far beyond the caches, so the copy runs at memory speed.
pub const MEMCPY_BUFFER_BYTES: usize = 256 << 20;

/// Measures `copy_from_slice` between two `bytes`-byte buffers and returns the best of `passes` in GB/s
/// (bytes copied per second, 1e9). Both buffers are written before the first pass, so page faults are not
/// timed.
pub fn measure_memcpy_gbps(bytes: usize, passes: usize) -> f64 {
    let source = vec![0x5au8; bytes];
    let mut destination = vec![0xa5u8; bytes];
    let mut best = Duration::MAX;
    for _ in 0..passes.max(1) {
        let started = Instant::now();
        destination.copy_from_slice(black_box(&source));
        black_box(&mut destination);
        best = best.min(started.elapsed());
    }
    bytes as f64 / best.as_secs_f64().max(f64::MIN_POSITIVE) / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memcpy_bandwidth_is_finite_and_positive() {
        let gbps = measure_memcpy_gbps(4 << 20, 2);
        assert!(gbps.is_finite() && gbps > 0.0, "{gbps}");
    }
}

//! Shared pieces of the multi-process tests: a deterministic workload whose every record can be checked
//! on its own, and process helpers.
//!
//! Record `n` of a stream has a length and contents that depend only on `(seed, n)`. Its first 8 bytes
//! hold `n`, the next 8 a checksum of the rest, so the reader checks each record's identity, order and
//! bytes without any shared state.

#![forbid(unsafe_code)]

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// The snapshot of the crash tests' journal of numbers: how many numbers it replaces.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Count(pub u64);

impl sluice_am::journal::SnapshotFormat for Count {}

/// A SplitMix64 step: a fast, well-mixed hash of one word.
pub fn mix(mut state: u64) -> u64 {
    state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    state = (state ^ (state >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    state = (state ^ (state >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    state ^ (state >> 31)
}

/// The payload length of record `sequence`: mostly 16 to 271 bytes, one in 256 up to 16 KiB.
pub fn record_len(seed: u64, sequence: u64) -> usize {
    let random = mix(seed ^ sequence.wrapping_mul(0xD6E8_FEB8_6659_FD93));
    if random.is_multiple_of(256) {
        16 + (random >> 8) as usize % (16 << 10)
    } else {
        16 + (random >> 8) as usize % 256
    }
}

/// Fills `payload` as record `sequence`: the sequence, a checksum, then pseudo-random bytes.
pub fn fill_record(seed: u64, sequence: u64, payload: &mut [u8]) {
    let body_seed = mix(seed ^ sequence);
    for (index, chunk) in payload[16..].chunks_mut(8).enumerate() {
        let word = mix(body_seed.wrapping_add(index as u64)).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    let checksum = checksum(&payload[16..]);
    payload[..8].copy_from_slice(&sequence.to_le_bytes());
    payload[8..16].copy_from_slice(&checksum.to_le_bytes());
}

/// Checks that `payload` is record `expected` of the stream; says what is wrong otherwise.
pub fn check_record(seed: u64, expected: u64, payload: &[u8]) -> Result<(), String> {
    let len = record_len(seed, expected);
    if payload.len() != len {
        return Err(format!(
            "record {expected}: {} bytes, expected {len}",
            payload.len()
        ));
    }
    let sequence = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
    if sequence != expected {
        return Err(format!("record {expected}: holds record {sequence}"));
    }
    let stored = u64::from_le_bytes(payload[8..16].try_into().expect("8 bytes"));
    if stored != checksum(&payload[16..]) {
        return Err(format!("record {expected}: checksum mismatch"));
    }
    Ok(())
}

/// FNV-1a over 8-byte words (the tail zero-padded).
pub fn checksum(bytes: &[u8]) -> u64 {
    bytes.chunks(8).fold(0xCBF2_9CE4_8422_2325, |hash, chunk| {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        (hash ^ u64::from_le_bytes(word)).wrapping_mul(0x0100_0000_01B3)
    })
}

/// Waits for `child` up to `limit`; kills it and fails with `what` when it takes longer.
pub fn wait_with_deadline(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}: killed (deadlock watchdog)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

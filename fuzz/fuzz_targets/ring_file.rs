//! A ring file holding records committed by the real producer, some of them released by a
//! consumer, then changed anywhere (header page, cursors, record headers, payloads) and cut to any
//! length, is opened, read to its end by a new consumer and taken over by a new producer, which
//! folds and walks the records left. Every step gives a ring, a record or an error: never a panic,
//! an abort or a read outside the mapping.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use sluice_ring::{RecordKind, RecordMeta, Ring, RingOptions, TryReserveError};

/// The data region of the ring: small, so that records wrap and padding appears.
const CAPACITY: u64 = 4096;
/// The bytes of the header page and the data region.
const FILE_LEN: usize = 4096 + CAPACITY as usize;

#[derive(Arbitrary, Debug)]
struct Input {
    /// The payload length of each record the producer commits, until the ring is full.
    payloads: Vec<u16>,
    /// How many of them a consumer reads and releases before the ring is changed.
    released: u8,
    /// Bytes of the file set to a value: (offset modulo the file's length, value).
    patches: Vec<(u16, u8)>,
    /// The length the file is cut or grown to, if any.
    length: Option<u16>,
}

/// A ring path of this process's own: each run of the target makes the ring there again.
fn ring_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("sluice-fuzz-{}.ring", std::process::id()))
    })
}

fn meta(row: u64) -> RecordMeta {
    RecordMeta {
        kind: RecordKind::Batch,
        task_id: 1,
        first_row: row,
        row_count: 1,
    }
}

/// Makes the ring, commits the records and releases the first `released`.
fn write_ring(input: &Input) {
    let path = ring_path();
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => panic!("removing {}: {error}", path.display()),
    }
    let ring = RingOptions::new(path)
        .capacity(CAPACITY)
        .create()
        .expect("a new ring");
    let mut producer = ring.producer().expect("the producer role");
    let mut consumer = ring.consumer().expect("the consumer role");
    for (row, &len) in input.payloads.iter().enumerate() {
        let len = usize::from(len) % 1500;
        match producer.try_reserve(len) {
            Ok(mut slot) => {
                slot.payload_mut().fill(row as u8);
                slot.commit(meta(row as u64));
            }
            Err(TryReserveError::Full) => break,
            Err(error) => panic!("reserving {len} bytes: {error}"),
        }
    }
    producer.flush();
    for _ in 0..input.released {
        if consumer.try_next().is_err() {
            break;
        }
    }
}

fuzz_target!(|input: Input| {
    write_ring(&input);
    let path = ring_path();
    let mut bytes = std::fs::read(path).expect("the ring file");
    assert_eq!(bytes.len(), FILE_LEN);
    for &(offset, value) in &input.patches {
        bytes[usize::from(offset) % FILE_LEN] = value;
    }
    if let Some(length) = input.length {
        bytes.resize(usize::from(length), 0);
    }
    std::fs::write(path, &bytes).expect("the changed ring file");

    let Ok(ring) = Ring::open(path) else {
        return;
    };
    if let Ok(mut consumer) = ring.consumer() {
        for _ in 0..64 {
            match consumer.try_next() {
                Ok(record) => assert!(record.payload().len() as u64 <= ring.max_payload()),
                Err(_) => break,
            }
        }
    }
    if let Ok(mut producer) = ring.producer() {
        let _ = producer.fold();
        let _ = producer.unread(|_| {});
    }
});

//! Model checks of the cursor and wake-up protocol under every interleaving loom explores.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p sluice-ring --test loom --release`. A lost wake-up shows
//! as a deadlock, which loom reports; a publication race shows as a wrong payload or sequence number.
#![cfg(loom)]

use loom::thread;
use sluice_ring::{RecordKind, RecordMeta, Ring};

fn model(test: impl Fn() + Sync + Send + 'static) {
    model_with_bound(3, test);
}

fn model_with_bound(preemptions: usize, test: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemptions);
    builder.check(test);
}

fn meta(row: u64) -> RecordMeta {
    RecordMeta {
        kind: RecordKind::Batch,
        task_id: 1,
        first_row: row,
        row_count: 1,
    }
}

/// Three records of 1500 bytes through a 4096-byte ring: the producer must wait for space, and the third
/// record needs padding before it, so both futexes and the padding path are exercised.
#[test]
fn records_cross_a_full_ring_without_loss_or_lost_wakeup() {
    model(|| {
        let ring = Ring::in_memory(4096).expect("ring");
        let mut producer = ring.producer().expect("producer");
        let mut consumer = ring.consumer().expect("consumer");
        let writer = thread::spawn(move || {
            for row in 0..3u64 {
                let mut slot = producer.reserve(1500).expect("reserve");
                slot.payload_mut()[0] = row as u8 + 1;
                slot.payload_mut()[1499] = row as u8 + 101;
                slot.commit(meta(row));
            }
            producer.close();
        });
        for row in 0..3u64 {
            let record = consumer
                .next()
                .expect("next")
                .expect("a record before the end");
            assert_eq!(record.sequence(), row);
            assert_eq!(record.meta(), meta(row));
            assert_eq!(record.payload()[0], row as u8 + 1);
            assert_eq!(record.payload()[1499], row as u8 + 101);
        }
        assert!(consumer.next().expect("next").is_none());
        writer.join().expect("writer");
    });
}

/// A consumer that goes to sleep on an empty ring is woken by the close.
#[test]
fn close_wakes_a_sleeping_consumer() {
    model(|| {
        let ring = Ring::in_memory(4096).expect("ring");
        let producer = ring.producer().expect("producer");
        let mut consumer = ring.consumer().expect("consumer");
        let writer = thread::spawn(move || producer.close());
        assert!(consumer.next().expect("next").is_none());
        writer.join().expect("writer");
    });
}

/// Small records, each released as soon as read, in a ring that holds two of them.
#[test]
fn small_records_ping_pong_through_a_tiny_ring() {
    model(|| {
        let ring = Ring::in_memory(4096).expect("ring");
        let mut producer = ring.producer().expect("producer");
        let mut consumer = ring.consumer().expect("consumer");
        let writer = thread::spawn(move || {
            for row in 0..4u64 {
                let mut slot = producer.reserve(1800).expect("reserve");
                slot.payload_mut()[0] = row as u8;
                slot.commit(meta(row));
            }
            producer.close();
        });
        let mut seen = 0;
        while let Some(record) = consumer.next().expect("next") {
            assert_eq!(record.payload()[0], seen as u8);
            seen += 1;
        }
        assert_eq!(seen, 4);
        writer.join().expect("writer");
    });
}

/// Records of 1024 bytes in a 4096-byte ring whose consumer publishes its cursor every 2048 bytes: the
/// producer fills the ring and waits while releases are pending, and neither side may wait forever on
/// progress the other has not published.
#[test]
fn batched_releases_never_strand_a_waiting_producer() {
    model_with_bound(2, || {
        let ring = Ring::in_memory(4096).expect("ring");
        let mut producer = ring.producer().expect("producer");
        let mut consumer = ring.consumer().expect("consumer");
        let writer = thread::spawn(move || {
            for row in 0..6u64 {
                let mut slot = producer.reserve(960).expect("reserve");
                slot.payload_mut()[959] = row as u8;
                slot.commit(meta(row));
            }
            producer.close();
        });
        let mut seen = 0u64;
        while let Some(record) = consumer.next().expect("next") {
            assert_eq!(record.sequence(), seen);
            assert_eq!(record.payload()[959], seen as u8);
            seen += 1;
        }
        assert_eq!(seen, 6);
        writer.join().expect("writer");
    });
}

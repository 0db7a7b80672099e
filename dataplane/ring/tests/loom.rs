//! Model checks of the cursor and wake-up protocol under every interleaving loom explores.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p sluice-ring --test loom --release`. A lost wake-up shows
//! as a deadlock, which loom reports; a publication race shows as a wrong payload or sequence number.
#![cfg(loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, Ordering};
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
        tag: 0,
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

/// Records of 512 bytes (with their headers) through a 4096-byte ring whose producer publishes every
/// 1024 bytes and whose consumer releases every 2048: commits wait in batches, the ring wraps and fills,
/// and the last batch is published only by the close.
#[test]
fn batched_commits_arrive_whole_and_in_order() {
    model_with_bound(2, || {
        let ring = Ring::in_memory(4096).expect("ring");
        let mut producer = ring.producer().expect("producer");
        let mut consumer = ring.consumer().expect("consumer");
        let writer = thread::spawn(move || {
            for row in 0..9u64 {
                let mut slot = producer.reserve(448).expect("reserve");
                slot.payload_mut()[0] = row as u8;
                slot.payload_mut()[447] = row as u8 + 101;
                slot.commit(meta(row));
            }
            producer.close();
        });
        let mut seen = 0u64;
        while let Some(record) = consumer.next().expect("next") {
            assert_eq!(record.sequence(), seen);
            assert_eq!(record.meta(), meta(seen));
            assert_eq!(record.payload()[0], seen as u8);
            assert_eq!(record.payload()[447], seen as u8 + 101);
            seen += 1;
        }
        assert_eq!(seen, 9);
        writer.join().expect("writer");
    });
}

/// A consumer asleep on an empty ring makes the producer's next commit publish at once, well below the
/// batch threshold and with no flush: the producer waits for the record to arrive before it closes, so
/// a commit that stayed unpublished would leave both sides waiting forever.
#[test]
fn a_sleeping_consumer_forces_the_next_commit_out() {
    model(|| {
        let ring = Ring::in_memory(4096).expect("ring");
        let mut producer = ring.producer().expect("producer");
        let mut consumer = ring.consumer().expect("consumer");
        let received = Arc::new(AtomicBool::new(false));
        let writer = {
            let ring = ring.clone();
            let received = Arc::clone(&received);
            thread::spawn(move || {
                while !ring.consumer_waits() {
                    thread::yield_now();
                }
                let mut slot = producer.reserve(8).expect("reserve");
                slot.payload_mut()[7] = 42;
                slot.commit(meta(0));
                // Acquire pairs with the Release store below, once the record arrived.
                while !received.load(Ordering::Acquire) {
                    thread::yield_now();
                }
                producer.close();
            })
        };
        let record = consumer.next().expect("next").expect("the record");
        assert_eq!(record.payload()[7], 42);
        drop(record);
        received.store(true, Ordering::Release);
        assert!(consumer.next().expect("next").is_none());
        writer.join().expect("writer");
    });
}

/// A lease released on another thread, after a record read behind it, while the producer waits for
/// the space the lease holds: the read cursor passes both records only once the lease goes, and the
/// release wakes the producer.
#[test]
fn a_lease_released_out_of_order_on_another_thread_frees_its_space() {
    model_with_bound(2, || {
        let ring = Ring::in_memory(4096).expect("ring");
        let mut producer = ring.producer().expect("producer");
        let mut consumer = ring.consumer().expect("consumer");
        let writer = thread::spawn(move || {
            for row in 0..3u64 {
                let mut slot = producer.reserve(1500).expect("reserve");
                slot.payload_mut()[0] = row as u8 + 1;
                slot.commit(meta(row));
            }
            producer.close();
        });
        let held = consumer.next().expect("next").expect("record 0").lease();
        let second = consumer.next().expect("next").expect("record 1");
        assert_eq!(second.payload()[0], 2);
        drop(second);
        assert_eq!(consumer.position(), 0, "the lease holds the prefix");
        let releaser = thread::spawn(move || {
            assert_eq!(held.payload()[0], 1);
            held.release();
        });
        let third = consumer.next().expect("next").expect("record 2");
        assert_eq!(third.sequence(), 2);
        assert_eq!(third.payload()[0], 3);
        drop(third);
        assert!(consumer.next().expect("next").is_none());
        releaser.join().expect("releaser");
        writer.join().expect("writer");
    });
}

/// Records of 1024 bytes (with their headers) through a 4096-byte ring whose producer keeps what the
/// consumer released until it folds it: the producer can only make room by folding, also while it
/// sleeps on a full ring, and it must fold each record once, in order, never past the read cursor, and
/// never overwrite a record before folding it (the consumer checks every payload).
#[test]
fn a_waiting_producer_folds_released_records_once_in_order() {
    model_with_bound(2, || {
        let ring = Ring::in_memory(4096).expect("ring");
        let mut producer = ring.producer().expect("producer");
        let mut consumer = ring.consumer().expect("consumer");
        let folded = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = std::sync::Arc::clone(&folded);
        producer.set_fold_hook(move |meta, _| sink.lock().expect("lock").push(meta.first_row));
        let observer = ring.clone();
        let writer = thread::spawn(move || {
            for row in 0..6u64 {
                let mut slot = producer.reserve(960).expect("reserve");
                slot.payload_mut()[0] = row as u8;
                slot.payload_mut()[959] = row as u8 + 101;
                slot.commit(meta(row));
                assert!(producer.retained_position() <= observer.cursors().1);
            }
            producer.close();
        });
        let mut seen = 0u64;
        while let Some(record) = consumer.next().expect("next") {
            assert_eq!(record.meta(), meta(seen));
            assert_eq!(record.payload()[0], seen as u8);
            assert_eq!(record.payload()[959], seen as u8 + 101);
            seen += 1;
        }
        assert_eq!(seen, 6);
        writer.join().expect("writer");
        let folded = folded.lock().expect("lock").clone();
        assert!(
            folded.len() >= 2,
            "six records through a ring of four need two folds"
        );
        assert_eq!(folded, (0..folded.len() as u64).collect::<Vec<_>>());
    });
}

//! The ring's protocol within one process: records, wrap-around, back-pressure, roles and recovery.

use std::thread;
use std::time::Duration;

use proptest::prelude::*;

use crate::layout::{HEADER_LEN, RECORD_HEADER_LEN};
use crate::*;

fn batch(task_id: u64, first_row: u64, row_count: u64) -> RecordMeta {
    RecordMeta {
        kind: RecordKind::Batch,
        task_id,
        first_row,
        row_count,
        tag: 0,
    }
}

fn write(producer: &mut Producer, bytes: &[u8], meta: RecordMeta) -> u64 {
    let mut slot = producer.reserve(bytes.len()).expect("reserve");
    slot.payload_mut().copy_from_slice(bytes);
    slot.commit(meta)
}

fn pattern(sequence: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|index| (sequence as usize * 31 + index * 7) as u8)
        .collect()
}

/// A ring file in its own temporary directory, removed at the end of the test.
fn file_ring(capacity: u64) -> (tempfile::TempDir, std::path::PathBuf, Ring) {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join("job").join("0.ring");
    let ring = RingOptions::new(&path)
        .capacity(capacity)
        .create()
        .expect("create");
    (directory, path, ring)
}

/// The training data is the user's alone: a ring is 0600, and the directory made for it 0700.
#[test]
#[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
fn a_ring_and_the_directory_made_for_it_are_private() {
    use std::os::unix::fs::MetadataExt;
    let (directory, path, _ring) = file_ring(64 * 1024);
    let mode = |path: &std::path::Path| std::fs::metadata(path).expect("stat").mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&directory.path().join("job")), 0o700);
}

/// A producer far ahead of its consumer writes large records around the cache; the consumer, on
/// another thread, reads every byte of each as written, in pieces at any alignment.
#[test]
#[cfg_attr(
    miri,
    ignore = "moves 96 MiB, too slow under Miri, which copies plainly anyway"
)]
fn records_written_far_ahead_of_the_consumer_arrive_whole() {
    const RECORD: usize = 1 << 20;
    const RECORDS: u64 = 96;
    let sut = Ring::in_memory(64 << 20).expect("ring");
    let mut producer = sut.producer().expect("producer");
    let mut consumer = sut.consumer().expect("consumer");
    let reader = thread::spawn(move || {
        // Late, so that the producer runs ahead of it by most of the ring.
        thread::sleep(Duration::from_millis(200));
        for sequence in 0..RECORDS {
            let record = consumer.next().expect("next").expect("a record");
            assert!(
                record.payload() == pattern(sequence, RECORD + 3),
                "record {sequence} differs from what was written"
            );
        }
    });
    let mut streamed = 0;
    for sequence in 0..RECORDS {
        let bytes = pattern(sequence, RECORD + 3);
        let mut slot = producer.reserve(bytes.len()).expect("reserve");
        streamed += u32::from(slot.streams());
        // An odd first piece, so that the second starts off every alignment.
        slot.write(0, &bytes[..5]);
        slot.write(5, &bytes[5..]);
        slot.commit(batch(0, sequence, 1));
    }
    producer.flush();
    reader.join().expect("the consumer read every record whole");
    if crate::stream::STREAMS {
        assert!(streamed > 0, "no record was written around the cache");
    }
    assert!(
        streamed < RECORDS as u32,
        "the first records, with the consumer close, were written plainly"
    );
}

#[test]
fn records_come_out_in_order_with_their_metadata() {
    let sut = Ring::in_memory(1 << 16).expect("ring");
    let mut producer = sut.producer().expect("producer");
    let mut consumer = sut.consumer().expect("consumer");
    for sequence in 0..10 {
        let written = write(
            &mut producer,
            &pattern(sequence, 100 + sequence as usize),
            batch(3, sequence * 10, 10),
        );
        assert_eq!(written, sequence);
    }
    producer.flush();
    for sequence in 0..10 {
        let record = consumer.next().expect("next").expect("a record");
        assert_eq!(record.sequence(), sequence);
        assert_eq!(record.meta(), batch(3, sequence * 10, 10));
        assert_eq!(record.payload(), pattern(sequence, 100 + sequence as usize));
        assert_eq!(
            record.payload().as_ptr() as usize % 64,
            0,
            "payloads are 64-byte aligned"
        );
    }
    assert!(matches!(consumer.try_next(), Err(TryRecvError::Empty)));
}

#[test]
fn records_never_wrap_and_padding_is_invisible() {
    let sut = Ring::in_memory(4096).expect("ring");
    let mut producer = sut.producer().expect("producer");
    let mut consumer = sut.consumer().expect("consumer");
    // 1000-byte payloads take 1088 bytes: three fit, the fourth needs padding to the end of the region.
    for round in 0..if cfg!(miri) { 8 } else { 50u64 } {
        write(&mut producer, &pattern(round, 1000), batch(0, round, 1));
        let record = consumer.next().expect("next").expect("record");
        assert_eq!(record.sequence(), round, "padding takes no sequence number");
        assert_eq!(record.payload(), pattern(round, 1000));
        let offset = record.position() % 4096;
        assert!(offset + 1088 <= 4096, "record at offset {offset} wraps");
    }
}

#[test]
fn a_full_ring_is_back_pressure_not_loss() {
    let sut = Ring::in_memory(8192).expect("ring");
    let mut producer = sut.producer().expect("producer");
    let mut consumer = sut.consumer().expect("consumer");
    let total = if cfg!(miri) { 40 } else { 2000u64 };
    let writer = thread::spawn(move || {
        for sequence in 0..total {
            let len = (sequence as usize * 37) % 3000;
            write(
                &mut producer,
                &pattern(sequence, len),
                batch(1, sequence, 1),
            );
        }
        let full_wait = producer.full_wait();
        producer.close();
        full_wait
    });
    let mut received = 0;
    while let Some(record) = consumer.next().expect("next") {
        assert_eq!(record.sequence(), received);
        let len = (received as usize * 37) % 3000;
        assert_eq!(record.payload(), pattern(received, len));
        received += 1;
    }
    let full_wait = writer.join().expect("writer thread");
    assert_eq!(received, total);
    assert!(matches!(consumer.try_next(), Err(TryRecvError::Closed)));
    assert!(full_wait > Duration::ZERO || consumer.empty_wait() > Duration::ZERO);
}

#[test]
fn the_header_sums_the_waits_of_both_sides_for_other_processes_to_read() {
    let sut = Ring::in_memory(4096).expect("ring");
    let mut producer = sut.producer().expect("producer");
    let mut consumer = sut.consumer().expect("consumer");
    let pause = Duration::from_millis(if cfg!(miri) { 5 } else { 30 });
    let reader = thread::spawn(move || {
        // Empty until the producer writes after its pause.
        let first = consumer
            .next()
            .expect("next")
            .expect("first record")
            .sequence();
        // The producer now waits on a full ring until this side reads on after its pause.
        thread::sleep(pause);
        let mut last = first;
        while let Some(record) = consumer.next().expect("next") {
            last = record.sequence();
        }
        (last, consumer.empty_wait())
    });
    thread::sleep(pause);
    for sequence in 0..8 {
        write(
            &mut producer,
            &pattern(sequence, 1500),
            batch(1, sequence, 1),
        );
    }
    let full_wait = producer.full_wait();
    producer.close();
    let (last, empty_wait) = reader.join().expect("reader");
    assert_eq!(last, 7);
    let (consumer_waited, producer_waited) = sut.waits();
    // Under Miri the bounded spin before a side sleeps can outlast the pause, and spinning is not
    // counted as waiting; natively the spin is over in microseconds.
    if !cfg!(miri) {
        assert!(
            empty_wait >= pause / 2,
            "the consumer waited {empty_wait:?}"
        );
        assert!(full_wait >= pause / 2, "the producer waited {full_wait:?}");
    }
    assert_eq!(
        consumer_waited, empty_wait,
        "the header holds the consumer's waits"
    );
    assert_eq!(
        producer_waited, full_wait,
        "the header holds the producer's waits"
    );
}

#[test]
fn try_reserve_reports_full_and_too_large() {
    let sut = Ring::in_memory(4096).expect("ring");
    let mut producer = sut.producer().expect("producer");
    assert!(matches!(
        producer.try_reserve(4096),
        Err(TryReserveError::TooLarge { max: 4032, .. })
    ));
    assert!(matches!(
        producer.reserve(5000),
        Err(ReserveError::TooLarge { .. })
    ));
    let slot = producer
        .try_reserve(4032)
        .expect("the largest record fits an empty ring");
    slot.commit(batch(0, 0, 1));
    assert!(matches!(
        producer.try_reserve(0),
        Err(TryReserveError::Full)
    ));
}

#[test]
fn an_abandoned_slot_publishes_nothing() {
    let sut = Ring::in_memory(4096).expect("ring");
    let mut producer = sut.producer().expect("producer");
    let mut consumer = sut.consumer().expect("consumer");
    producer
        .reserve(100)
        .expect("reserve")
        .payload_mut()
        .fill(0xAA);
    write(&mut producer, b"kept", batch(0, 0, 1));
    producer.flush();
    let record = consumer.next().expect("next").expect("record");
    assert_eq!(record.payload(), b"kept");
    assert_eq!(record.sequence(), 0);
}

#[test]
fn commits_are_published_in_batches_and_on_flush() {
    // A 64 KiB ring publishes once 8 KiB are pending; records of 100 bytes take 192.
    let sut = Ring::in_memory(1 << 16).expect("ring");
    let mut producer = sut.producer().expect("producer");
    let mut consumer = sut.consumer().expect("consumer");
    write(&mut producer, &pattern(0, 100), batch(0, 0, 1));
    assert_eq!(producer.position(), 192);
    assert_eq!(producer.published_position(), 0);
    assert_eq!(producer.published_sequence(), 0);
    assert_eq!(sut.cursors(), (0, 0));
    assert!(
        matches!(consumer.try_next(), Err(TryRecvError::Empty)),
        "an unpublished commit is invisible"
    );
    producer.flush();
    assert_eq!(producer.published_position(), 192);
    assert_eq!(producer.published_sequence(), 1);
    assert_eq!(sut.cursors().0, 192);
    assert_eq!(
        consumer.try_next().expect("flushed").payload(),
        pattern(0, 100)
    );

    let threshold = 8 << 10;
    let mut sequence = 1;
    while producer.position() - 192 < threshold {
        assert_eq!(producer.published_position(), 192, "published early");
        write(
            &mut producer,
            &pattern(sequence, 100),
            batch(0, sequence, 1),
        );
        sequence += 1;
    }
    assert_eq!(producer.published_position(), producer.position());
    assert_eq!(producer.published_sequence(), sequence);
    for expected in 1..sequence {
        let record = consumer.try_next().expect("published by the threshold");
        assert_eq!(record.sequence(), expected);
        assert_eq!(record.payload(), pattern(expected, 100));
    }
    assert!(matches!(consumer.try_next(), Err(TryRecvError::Empty)));
}

#[test]
fn a_full_ring_publishes_pending_commits_before_reporting_it() {
    let sut = Ring::in_memory(4096).expect("ring");
    let mut producer = sut.producer().expect("producer");
    let mut consumer = sut.consumer().expect("consumer");
    write(&mut producer, b"pending", batch(0, 0, 1));
    assert_eq!(producer.published_position(), 0);
    assert!(matches!(
        producer.try_reserve(4000),
        Err(TryReserveError::Full)
    ));
    assert_eq!(producer.published_position(), 128);
    assert_eq!(
        consumer.try_next().expect("published").payload(),
        b"pending"
    );
}

#[test]
fn a_waiting_consumer_gets_the_next_commit_without_a_flush() {
    let sut = Ring::in_memory(1 << 16).expect("ring");
    let mut producer = sut.producer().expect("producer");
    let mut consumer = sut.consumer().expect("consumer");
    let (received, receiver) = std::sync::mpsc::channel();
    let reader = thread::spawn(move || {
        let record = consumer.next().expect("next").expect("a record");
        received
            .send(record.payload().to_vec())
            .expect("the test waits");
    });
    wait_until(|| sut.consumer_waits(), "the consumer to sleep");
    write(&mut producer, b"at once", batch(0, 0, 1));
    let payload = receiver
        .recv_timeout(Duration::from_secs(30))
        .expect("the sleeping consumer got the commit while the producer still holds it");
    assert_eq!(payload, b"at once");
    assert_eq!(producer.published_sequence(), 1);
    assert!(!sut.consumer_waits());
    reader.join().expect("reader");
}

#[test]
fn a_producer_waiting_for_space_shows_as_waiting() {
    let sut = Ring::in_memory(4096).expect("ring");
    let mut producer = sut.producer().expect("producer");
    let mut consumer = sut.consumer().expect("consumer");
    let writer = thread::spawn(move || {
        for sequence in 0..2 {
            write(
                &mut producer,
                &pattern(sequence, 3000),
                batch(0, sequence, 1),
            );
        }
        producer.close();
    });
    let first = consumer.next().expect("next").expect("first record");
    wait_until(|| sut.producer_waits(), "the producer to sleep");
    assert_eq!(first.payload(), pattern(0, 3000));
    drop(first);
    let second = consumer.next().expect("next").expect("second record");
    assert_eq!(second.payload(), pattern(1, 3000));
    drop(second);
    assert!(consumer.next().expect("next").is_none());
    writer.join().expect("writer");
    assert!(!sut.producer_waits());
}

/// Polls `condition` until it holds; fails naming `what` after a deadlock watchdog's 30 seconds.
fn wait_until(condition: impl Fn() -> bool, what: &str) {
    let started = std::time::Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "waited 30 s for {what}: deadlock watchdog"
        );
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn roles_are_exclusive_while_their_holder_lives() {
    let sut = Ring::in_memory(4096).expect("ring");
    let producer = sut.producer().expect("producer");
    assert!(matches!(
        sut.producer(),
        Err(AttachError::Busy {
            role: Role::Producer,
            ..
        })
    ));
    let consumer = sut.consumer().expect("consumer");
    assert!(matches!(
        sut.consumer(),
        Err(AttachError::Busy {
            role: Role::Consumer,
            ..
        })
    ));
    assert!(sut.producer_state().is_alive());
    drop(producer);
    drop(consumer);
    assert_eq!(sut.producer_state(), PeerState::Absent);
    assert!(sut.producer().is_ok(), "a released role can be taken again");
}

#[test]
fn a_new_producer_continues_after_the_last_committed_record() {
    let sut = Ring::in_memory(4096).expect("ring");
    let mut consumer = sut.consumer().expect("consumer");
    let mut first = sut.producer().expect("producer");
    for sequence in 0..3 {
        write(&mut first, &pattern(sequence, 900), batch(0, sequence, 1));
    }
    first
        .reserve(500)
        .expect("reserve")
        .payload_mut()
        .fill(0xEE);
    drop(first);

    let record = consumer.next().expect("next").expect("record");
    assert_eq!(record.sequence(), 0);
    drop(record);

    let mut second = sut.producer().expect("reattach");
    assert_eq!(
        second.next_sequence(),
        3,
        "recovered from the unread records"
    );
    for sequence in 3..8 {
        write(&mut second, &pattern(sequence, 900), batch(0, sequence, 1));
        if sequence == 4 {
            // Drains the ring so that the next reattachment recovers from the consumer's count.
            for expected in 1..=4 {
                let record = consumer.next().expect("next").expect("record");
                assert_eq!(record.sequence(), expected);
                assert_eq!(record.payload(), pattern(expected, 900));
            }
            drop(second);
            second = sut.producer().expect("reattach to an empty ring");
            assert_eq!(second.next_sequence(), 5, "recovered from the consumer");
        }
    }
    second.close();
    let rest: Vec<u64> = std::iter::from_fn(|| {
        consumer
            .next()
            .expect("next")
            .map(|record| record.sequence())
    })
    .collect();
    assert_eq!(rest, vec![5, 6, 7]);
}

#[test]
fn a_consumer_without_producer_gives_up_after_its_timeout() {
    let sut = Ring::in_memory(4096).expect("ring");
    let mut consumer = sut.consumer().expect("consumer");
    consumer.set_peer_timeout(Duration::from_millis(50));
    let error = consumer.next().expect_err("no producer");
    assert!(matches!(
        error,
        RecvError::ProducerGone {
            last_producer: None,
            ..
        }
    ));
    assert!(error.to_string().contains("no live producer"), "{error}");
}

#[test]
fn a_consumer_waits_through_a_producer_restart() {
    let sut = Ring::in_memory(4096).expect("ring");
    let mut consumer = sut.consumer().expect("consumer");
    consumer.set_peer_timeout(Duration::from_secs(30));
    let producer = sut.producer().expect("producer");
    drop(producer);
    let ring = sut.clone();
    let restarted = thread::spawn(move || {
        thread::sleep(Duration::from_millis(150));
        let mut producer = ring.producer().expect("new producer");
        write(&mut producer, b"after the gap", batch(0, 0, 1));
        producer.close();
    });
    let record = consumer.next().expect("next").expect("record");
    assert_eq!(record.payload(), b"after the gap");
    drop(record);
    assert!(consumer.next().expect("next").is_none());
    restarted.join().expect("thread");
}

#[test]
fn a_producer_on_a_full_ring_without_consumer_gives_up_after_its_timeout() {
    let sut = Ring::in_memory(4096).expect("ring");
    let mut producer = sut.producer().expect("producer");
    producer.set_peer_timeout(Duration::from_millis(50));
    write(&mut producer, &[0; 4000], batch(0, 0, 1));
    let error = producer.reserve(1000).expect_err("full, no consumer");
    assert!(matches!(error, ReserveError::ConsumerGone { .. }));
    assert!(error.to_string().contains("no live consumer"), "{error}");
}

#[test]
fn a_closed_ring_takes_no_new_producer() {
    let sut = Ring::in_memory(4096).expect("ring");
    sut.producer().expect("producer").close();
    assert!(sut.is_closed());
    assert!(matches!(sut.producer(), Err(AttachError::Closed { .. })));
}

/// The resident kilobytes of each mapping of the file at `path` in this process, from
/// `/proc/self/smaps`. By inode: the creator mapped the file under its temporary name.
fn resident_kib_of_mappings(path: &std::path::Path) -> Vec<u64> {
    use std::os::unix::fs::MetadataExt;
    let inode = std::fs::metadata(path).expect("stat").ino().to_string();
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("read /proc/self/smaps");
    let mut resident = Vec::new();
    let mut in_ring = false;
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let first = fields.first().copied().unwrap_or_default();
        if first.contains('-') && !first.ends_with(':') {
            in_ring = fields.get(4) == Some(&inode.as_str());
        } else if in_ring && first == "Rss:" {
            let kib = line.split_whitespace().nth(1).expect("a size");
            resident.push(kib.parse().expect("kilobytes"));
        }
    }
    resident
}

/// Both the creator's and an opener's mapping of a ring come to have every page mapped, without a
/// record written or read: a thread of their own fills in the page tables, so that the hot path takes
/// no page faults and neither side waited for it.
#[test]
#[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
fn the_page_tables_of_a_mapped_ring_are_filled_in_the_background() {
    let capacity = 8 << 20;
    let (_directory, path, _created) = file_ring(capacity);
    let _opened = Ring::open(&path).expect("open");
    let whole = (capacity + HEADER_LEN as u64) / 1024;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let resident = resident_kib_of_mappings(&path);
        assert_eq!(resident.len(), 2, "two mappings of {}", path.display());
        if resident.iter().all(|&kib| kib == whole) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "resident {resident:?} KiB of {whole} KiB per mapping after 30 s"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
fn file_rings_are_shared_between_handles() {
    let (_directory, path, sut) = file_ring(1 << 16);
    let mut producer = sut.producer().expect("producer");
    let reader = Ring::open(&path).expect("open");
    let mut consumer = reader.consumer().expect("consumer");
    write(&mut producer, b"through the file", batch(9, 0, 1));
    producer.flush();
    let record = consumer.next().expect("next").expect("record");
    assert_eq!(record.payload(), b"through the file");
    assert_eq!(record.meta().task_id, 9);
    assert_eq!(
        std::fs::metadata(&path).expect("stat").len(),
        (1 << 16) + 4096
    );
    assert!(matches!(
        RingOptions::new(&path).capacity(4096).create(),
        Err(RingCreateError::Exists { .. })
    ));
}

#[test]
#[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
fn creation_checks_free_space_and_capacity() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join("huge.ring");
    let free = free_bytes(directory.path()).expect("statvfs");
    let too_big = (free / 4096 + 1024) * 4096;
    let error = RingOptions::new(&path)
        .capacity(too_big)
        .create()
        .expect_err("larger than the filesystem");
    assert!(matches!(error, RingCreateError::NoSpace { .. }), "{error}");
    let message = error.to_string();
    assert!(
        message.contains("MiB free") && message.contains("--ring-size"),
        "{message}"
    );
    assert!(!path.exists(), "a failed creation leaves no file");
    assert!(
        std::fs::read_dir(directory.path())
            .expect("list")
            .next()
            .is_none(),
        "and no temporary file"
    );
    assert!(matches!(
        RingOptions::new(&path).capacity(1000).create(),
        Err(RingCreateError::InvalidCapacity { capacity: 1000 })
    ));
}

#[test]
#[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
fn foreign_and_truncated_files_are_rejected() {
    let directory = tempfile::tempdir().expect("tempdir");
    let short = directory.path().join("short.ring");
    std::fs::write(&short, b"not a ring").expect("write");
    assert!(matches!(
        Ring::open(&short),
        Err(RingOpenError::Truncated { len: 10, .. })
    ));

    let foreign = directory.path().join("foreign.ring");
    std::fs::write(&foreign, vec![0x5A; 8192]).expect("write");
    let error = Ring::open(&foreign).expect_err("foreign");
    assert!(error.to_string().contains("bad magic"), "{error}");

    let (_keep, path, ring) = file_ring(8192);
    drop(ring);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open");
    file.set_len(4096 + 4096).expect("truncate");
    let error = Ring::open(&path).expect_err("truncated");
    assert!(error.to_string().contains("truncated"), "{error}");

    let (_keep, path, ring) = file_ring(8192);
    drop(ring);
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[8] = 99;
    std::fs::write(&path, &bytes).expect("write");
    let error = Ring::open(&path).expect_err("version");
    assert!(error.to_string().contains("layout version 99"), "{error}");
}

#[test]
#[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
fn a_corrupt_record_is_an_error_naming_its_position() {
    let (_directory, path, sut) = file_ring(8192);
    let mut producer = sut.producer().expect("producer");
    write(&mut producer, &[1; 100], batch(0, 0, 1));
    write(&mut producer, &[2; 100], batch(0, 1, 1));
    producer.flush();
    let mut bytes = std::fs::read(&path).expect("read");
    // The second record starts at byte 192 of the data region; its row count sits 32 bytes in.
    bytes[HEADER_LEN + 192 + 32] ^= 0xFF;
    std::fs::write(&path, &bytes).expect("write");
    let mut consumer = sut.consumer().expect("consumer");
    assert_eq!(
        consumer.next().expect("first").expect("record").payload(),
        &[1; 100]
    );
    let error = consumer.next().expect_err("second is corrupt");
    assert!(
        matches!(error, RecvError::Corrupt { position: 192, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("checksum"), "{error}");
}

#[test]
#[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
fn gc_removes_rings_of_dead_processes_only() {
    let directory = tempfile::tempdir().expect("tempdir");
    let live_path = directory.path().join("live").join("0.ring");
    let live = RingOptions::new(&live_path)
        .capacity(4096)
        .create()
        .expect("create");
    let _producer = live.producer().expect("producer");

    let dead_path = directory.path().join("dead").join("0.ring");
    drop(
        RingOptions::new(&dead_path)
            .capacity(4096)
            .create()
            .expect("create"),
    );
    let dead_ledger = ledger::Ledger::path_beside(&dead_path);
    drop(ledger::Ledger::create(&dead_ledger, 0).expect("ledger"));
    let mut bytes = std::fs::read(&dead_path).expect("read");
    // Rewrites the creator as a process that does not exist (pid 0 with a start time).
    bytes[24..32].copy_from_slice(&(12345u64 << 22).to_le_bytes());
    std::fs::write(&dead_path, &bytes).expect("write");

    let foreign = directory.path().join("foreign.ring");
    std::fs::write(&foreign, b"hello").expect("write");

    let report = gc::collect(directory.path()).expect("gc");
    assert_eq!(report.removed, vec![dead_path.clone(), dead_ledger.clone()]);
    assert_eq!(report.kept, vec![live_path.clone()]);
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(
        report.removed_directories,
        vec![directory.path().join("dead")]
    );
    assert!(live_path.exists() && !dead_path.exists() && foreign.exists());
    assert!(!dead_ledger.exists());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any bytes in a ring file give a ring or an error, and reading whatever records it claims to hold
    /// gives records or an error: never a panic or a read outside the mapping.
    #[test]
    #[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
    fn any_file_bytes_are_rejected_or_read_safely(
        header_patch in proptest::collection::vec((0usize..512, any::<u8>()), 0..16),
        data in proptest::collection::vec(any::<u8>(), 0..4096),
        cursors in (0u64..20_000, 0u64..20_000, 0u64..20_000),
        keep_magic in any::<bool>(),
        file_len in prop_oneof![Just(8192u64), 0u64..9000],
    ) {
        let (_directory, path, ring) = file_ring(4096);
        drop(ring);
        let mut bytes = std::fs::read(&path).expect("read");
        for (offset, value) in header_patch {
            if keep_magic && offset < 24 {
                continue;
            }
            bytes[offset] = value;
        }
        // The write cursor's word lies at byte 512 (see the header layout), the read cursor's at 640.
        bytes[512..520].copy_from_slice(&(cursors.0 & !63).to_le_bytes());
        bytes[640..648].copy_from_slice(&(cursors.1 & !63).to_le_bytes());
        // The retain cursor's word lies at byte 1152.
        bytes[1152..1160].copy_from_slice(&(cursors.2 & !63).to_le_bytes());
        bytes[HEADER_LEN..HEADER_LEN + data.len()].copy_from_slice(&data);
        bytes.resize(file_len as usize, 0);
        std::fs::write(&path, &bytes).expect("write");
        let Ok(ring) = Ring::open(&path) else { return Ok(()); };
        let Ok(mut consumer) = ring.consumer() else { return Ok(()); };
        for _ in 0..64 {
            match consumer.try_next() {
                Ok(record) => {
                    let payload = record.payload();
                    prop_assert!(payload.len() as u64 <= 4096 - RECORD_HEADER_LEN);
                }
                Err(_) => break,
            }
        }
        drop(consumer);
        if let Ok(mut producer) = ring.producer() {
            let _ = producer.fold();
            let _ = producer.unread(|_, _| {});
        }
    }
}

/// The bytes of a record header as the producer lays them in the ring.
fn header_bytes(header: &layout::RecordHeader) -> [u8; RECORD_HEADER_LEN as usize] {
    let mut bytes = [0; RECORD_HEADER_LEN as usize];
    let words = [
        header.payload_len,
        header.sequence,
        header.task_id,
        header.first_row,
        header.row_count,
    ];
    for (index, word) in words.iter().enumerate() {
        bytes[index * 8..index * 8 + 8].copy_from_slice(&word.to_le_bytes());
    }
    bytes[40..44].copy_from_slice(&header.kind.to_le_bytes());
    bytes[44..48].copy_from_slice(&header.check.to_le_bytes());
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Records committed by the producer, one of whose headers is built again by the real header
    /// constructor with a payload length past the committed bytes or another sequence number: the
    /// checksum holds, the consumer reads the records before it and stops at it with the error of
    /// the length or sequence check, and the producer's walk over the unread records stops at a
    /// wrong length too.
    #[test]
    #[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
    fn a_sealed_header_with_a_wrong_length_or_sequence_stops_the_reader_at_it(
        lengths in proptest::collection::vec(0usize..3000, 2..8),
        target in any::<proptest::sample::Index>(),
        change_length in any::<bool>(),
        excess in prop_oneof![0u64..256, any::<u64>()],
        delta in 1..=u64::MAX,
    ) {
        use std::os::unix::fs::FileExt;

        let (_directory, path, sut) = file_ring(1 << 16);
        let mut producer = sut.producer().expect("producer");
        let mut positions = Vec::new();
        let mut written = 0;
        for (row, &len) in lengths.iter().enumerate() {
            positions.push(written);
            write(&mut producer, &pattern(row as u64, len), batch(1, row as u64, 1));
            written += layout::record_size(len as u64).expect("a small record");
        }
        producer.flush();
        let corrupt = 1 + target.index(lengths.len() - 1);
        let position = positions[corrupt];
        let meta = batch(1, corrupt as u64, 1);
        let (header, fault) = if change_length {
            // The smallest payload whose record takes more than the `room` bytes left is `room - 63`.
            let room = written - position;
            let payload_len = (room - (layout::RECORD_ALIGN - 1)).saturating_add(excess);
            (
                layout::RecordHeader::new(payload_len, corrupt as u64, Some(meta)),
                layout::RecordFault::Length { payload_len, room },
            )
        } else {
            let sequence = (corrupt as u64).wrapping_add(delta);
            (
                layout::RecordHeader::new(lengths[corrupt] as u64, sequence, Some(meta)),
                layout::RecordFault::Sequence { found: sequence, expected: corrupt as u64 },
            )
        };
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open")
            .write_all_at(&header_bytes(&header), HEADER_LEN as u64 + position)
            .expect("write the header");

        let mut consumer = sut.consumer().expect("consumer");
        for (row, &len) in lengths.iter().enumerate().take(corrupt) {
            let record = consumer
                .next()
                .expect("a record before the changed one")
                .expect("record");
            prop_assert_eq!(record.sequence(), row as u64);
            prop_assert_eq!(record.payload(), &pattern(row as u64, len)[..]);
        }
        match consumer.next() {
            Err(RecvError::Corrupt { position: at, reason, .. }) => {
                prop_assert_eq!(at, position);
                prop_assert_eq!(reason, fault.to_string());
            }
            Err(other) => prop_assert!(false, "another error: {other}"),
            Ok(record) => prop_assert!(false, "read {:?}", record.map(|record| record.meta())),
        }
        drop(consumer);
        let unread = producer.unread(|_, _| {});
        if change_length {
            match unread {
                Err(FoldError::Corrupt { position: at, reason, .. }) => {
                    prop_assert_eq!(at, position);
                    prop_assert_eq!(reason, fault.to_string());
                }
                Ok(()) => prop_assert!(false, "the unread records were walked past the changed one"),
            }
        }
    }
}

#[test]
fn header_offsets_used_by_tests_match_the_layout() {
    let sut = Ring::in_memory(4096).expect("ring");
    let header = sut.shared.header() as *const layout::RingHeader as usize;
    let write = &sut.shared.header().write.0 as *const _ as usize;
    let read = &sut.shared.header().read.0 as *const _ as usize;
    let creator = &sut.shared.header().creator as *const _ as usize;
    let retain = &sut.shared.header().retain.0 as *const _ as usize;
    assert_eq!(write - header, 512);
    assert_eq!(read - header, 640);
    assert_eq!(creator - header, 24);
    assert_eq!(retain - header, 1152);
}

/// Records the metas a producer folds, with their stream positions.
fn folded_into(
    producer: &mut Producer,
) -> std::sync::Arc<std::sync::Mutex<Vec<(RecordMeta, u64)>>> {
    let folded = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = folded.clone();
    producer.set_fold_hook(move |meta, position| sink.lock().expect("lock").push((meta, position)));
    folded
}

fn rows_of(metas: &[(RecordMeta, u64)]) -> Vec<u64> {
    metas.iter().map(|(meta, _)| meta.first_row).collect()
}

fn positions_of(metas: &[(RecordMeta, u64)]) -> Vec<u64> {
    metas.iter().map(|(_, position)| *position).collect()
}

#[test]
fn released_records_are_folded_once_in_order_and_unread_ones_listed() {
    let sut = Ring::in_memory(4096).expect("ring");
    let mut producer = sut.producer().expect("producer");
    let mut consumer = sut.consumer().expect("consumer");
    let folded = folded_into(&mut producer);
    for row in 0..3 {
        write(&mut producer, &pattern(row, 900), batch(5, row, 1));
    }
    producer.flush();
    for expected in 0..2 {
        let record = consumer.next().expect("next").expect("record");
        assert_eq!(record.meta().first_row, expected);
    }
    drop(consumer);
    let mut unread = Vec::new();
    producer
        .unread(|meta, position| unread.push((meta, position)))
        .expect("unread");
    assert_eq!(rows_of(&unread), vec![2]);
    assert_eq!(positions_of(&unread), vec![2 * 1024]);
    assert_eq!(producer.fold().expect("fold"), 2 * 1024);
    assert_eq!(producer.retained_position(), 2 * 1024);
    assert_eq!(producer.fold().expect("fold again"), 2 * 1024);
    assert_eq!(rows_of(&folded.lock().expect("lock")), vec![0, 1]);
    assert_eq!(positions_of(&folded.lock().expect("lock")), vec![0, 1024]);
}

#[test]
fn a_producer_folds_what_it_needs_and_never_overwrites_retained_records() {
    let sut = Ring::in_memory(4096).expect("ring");
    let mut producer = sut.producer().expect("producer");
    let mut consumer = sut.consumer().expect("consumer");
    let folded = folded_into(&mut producer);
    // 900-byte payloads take 1024 bytes: four fill the ring, the fifth needs the space of the first.
    for row in 0..4 {
        write(&mut producer, &pattern(row, 900), batch(1, row, 1));
    }
    producer.flush();
    assert!(matches!(
        producer.try_reserve(900),
        Err(TryReserveError::Full)
    ));
    drop(consumer.next().expect("next").expect("record"));
    drop(consumer.next().expect("next").expect("record"));
    drop(consumer);
    assert!(
        folded.lock().expect("lock").is_empty(),
        "nothing is folded before it is needed"
    );
    write(&mut producer, &pattern(4, 900), batch(1, 4, 1));
    assert_eq!(
        rows_of(&folded.lock().expect("lock")),
        vec![0, 1],
        "a fold takes every released record"
    );
    let mut unread = Vec::new();
    producer.flush();
    producer
        .unread(|meta, position| unread.push((meta, position)))
        .expect("unread");
    assert_eq!(rows_of(&unread), vec![2, 3, 4]);
    assert!(
        producer.retained_position() <= sut.cursors().1,
        "retain never passes read"
    );
}

#[test]
fn a_full_ring_folds_while_it_waits_for_the_consumer() {
    let sut = Ring::in_memory(8192).expect("ring");
    let mut producer = sut.producer().expect("producer");
    let mut consumer = sut.consumer().expect("consumer");
    let folded = folded_into(&mut producer);
    let total = if cfg!(miri) { 40 } else { 2000u64 };
    let writer = thread::spawn(move || {
        for row in 0..total {
            let len = (row as usize * 37) % 3000;
            write(&mut producer, &pattern(row, len), batch(1, row, 1));
        }
        producer.close();
    });
    let mut received = 0;
    while let Some(record) = consumer.next().expect("next") {
        assert_eq!(record.meta().first_row, received);
        received += 1;
    }
    writer.join().expect("writer");
    assert_eq!(received, total);
    let rows = rows_of(&folded.lock().expect("lock"));
    assert!(
        rows.len() as u64 > total / 2,
        "a writer ten times the ring's size folded only {} records",
        rows.len()
    );
    assert_eq!(rows, (0..rows.len() as u64).collect::<Vec<_>>());
}

#[test]
fn a_new_producer_folds_what_the_dead_one_retained() {
    let sut = Ring::in_memory(4096).expect("ring");
    let mut consumer = sut.consumer().expect("consumer");
    let mut first = sut.producer().expect("producer");
    let first_folded = folded_into(&mut first);
    for row in 0..3 {
        write(&mut first, &pattern(row, 900), batch(2, row, 1));
    }
    first.flush();
    drop(consumer.next().expect("next").expect("record"));
    drop(consumer.next().expect("next").expect("record"));
    drop(first);
    assert!(first_folded.lock().expect("lock").is_empty());

    let mut second = sut.producer().expect("reattach");
    assert_eq!(second.next_sequence(), 3);
    let second_folded = folded_into(&mut second);
    second.fold().expect("fold");
    assert_eq!(rows_of(&second_folded.lock().expect("lock")), vec![0, 1]);
    let mut unread = Vec::new();
    second
        .unread(|meta, position| unread.push((meta, position)))
        .expect("unread");
    assert_eq!(rows_of(&unread), vec![2]);
    drop(second);

    let mut third = sut.producer().expect("reattach");
    let third_folded = folded_into(&mut third);
    third.fold().expect("fold");
    assert!(
        third_folded.lock().expect("lock").is_empty(),
        "folded records are not folded again"
    );
    assert_eq!(third.next_sequence(), 3);
}

#[test]
#[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
fn a_corrupt_retained_record_is_an_error_naming_its_position() {
    let (_directory, path, sut) = file_ring(8192);
    let mut producer = sut.producer().expect("producer");
    write(&mut producer, &[1; 100], batch(0, 0, 1));
    write(&mut producer, &[2; 100], batch(0, 1, 1));
    producer.flush();
    let mut consumer = sut.consumer().expect("consumer");
    drop(consumer.next().expect("next").expect("record"));
    drop(consumer.next().expect("next").expect("record"));
    drop(consumer);
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[HEADER_LEN + 192 + 32] ^= 0xFF;
    std::fs::write(&path, &bytes).expect("write");
    let folded = folded_into(&mut producer);
    let error = producer.fold().expect_err("the second record is corrupt");
    assert!(
        matches!(error, FoldError::Corrupt { position: 192, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("checksum"), "{error}");
    assert_eq!(rows_of(&folded.lock().expect("lock")), vec![0]);
}

#[test]
fn without_a_hook_folding_moves_the_retain_cursor_to_the_read_cursor() {
    let sut = Ring::in_memory(8192).expect("ring");
    let mut producer = sut.producer().expect("producer");
    let mut consumer = sut.consumer().expect("consumer");
    for row in 0..3 {
        write(&mut producer, &[7; 100], batch(0, row, 1));
    }
    producer.flush();
    drop(consumer.next().expect("next").expect("record"));
    drop(consumer.next().expect("next").expect("record"));
    drop(consumer);
    assert_eq!(producer.fold().expect("fold"), 2 * 192);
    assert_eq!(producer.retained_position(), 2 * 192);
}

#[test]
#[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
fn a_read_cursor_off_a_record_boundary_is_an_error_when_folding() {
    let (_directory, path, sut) = file_ring(8192);
    let mut producer = sut.producer().expect("producer");
    write(&mut producer, &[1; 100], batch(0, 0, 1));
    producer.flush();
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[640..648].copy_from_slice(&100u64.to_le_bytes());
    std::fs::write(&path, &bytes).expect("write");
    let error = producer
        .fold()
        .expect_err("a read cursor of 100 is not a boundary");
    assert!(matches!(error, FoldError::Corrupt { .. }), "{error}");
    assert!(error.to_string().contains("read 100"), "{error}");
}

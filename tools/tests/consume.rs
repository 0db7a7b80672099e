//! `sluice consume`, the reference trainer, as a process reading a real ring that this test fills.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use sluice_ring::{RecordKind, RecordMeta, RingOptions};

const ROWS: i64 = 10_000;

fn batch(first: i64, rows: i64) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    RecordBatch::try_new(
        schema,
        vec![Arc::new(Int64Array::from_iter_values(first..first + rows))],
    )
    .expect("batch")
}

/// Creates the ring at `path` and writes ids 0..ROWS in batches of 97 rows, then closes it.
fn produce(path: &std::path::Path) {
    let ring = RingOptions::new(path)
        .capacity(256 << 10)
        .create()
        .expect("create ring");
    let mut producer = ring.producer().expect("producer");
    let mut encoder = sluice_client::Encoder::new(batch(0, 1).schema()).expect("encoder");
    encoder.write_schema(&mut producer).expect("schema");
    let mut first = 0;
    while first < ROWS {
        let rows = 97.min(ROWS - first);
        encoder
            .write_batch(
                &mut producer,
                &batch(first, rows),
                3,
                first as u64,
                rows as u64,
            )
            .expect("batch");
        first += rows;
    }
    let slot = producer.reserve(0).expect("reserve");
    slot.commit(RecordMeta::of_kind(RecordKind::EndOfEpoch));
    producer.close();
}

#[test]
fn consume_reads_every_id_once_and_exits_at_the_end_of_data() {
    let directory = tempfile::tempdir().expect("tempdir");
    let ring = directory.path().join("0.ring");
    let ids = directory.path().join("ids.bin");
    // The trainer starts before the daemon has created its ring, as under the launcher.
    let mut consumer = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("consume")
        .arg("--ids-out")
        .arg(&ids)
        .env("SLUICE_RING", &ring)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice consume");
    let mut waiting = String::new();
    BufReader::new(consumer.stderr.take().expect("stderr"))
        .read_line(&mut waiting)
        .expect("read stderr");
    assert!(
        waiting.starts_with("sluice consume: waiting up to"),
        "consume says it waits for its ring: {waiting}"
    );
    produce(&ring);
    let output = consumer.wait_with_output().expect("wait");
    assert!(output.status.success(), "sluice consume failed");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("one JSON line");
    assert_eq!(report["rows"], ROWS);
    let bytes = std::fs::read(&ids).expect("ids file");
    let seen: Vec<i64> = bytes
        .chunks_exact(8)
        .map(|chunk| i64::from_le_bytes(chunk.try_into().expect("8 bytes")))
        .collect();
    assert_eq!(seen, (0..ROWS).collect::<Vec<_>>());
}

/// Ids in `path`, as `sluice consume --ids-out` writes them.
fn ids_in(path: &std::path::Path) -> Vec<i64> {
    std::fs::read(path)
        .unwrap_or_default()
        .chunks_exact(8)
        .map(|chunk| i64::from_le_bytes(chunk.try_into().expect("8 bytes")))
        .collect()
}

/// Writes the schema file beside `path` (for a trainer started again, which meets batches before
/// any schema record), the schema and ids `0..rows` in batches of 97, and returns where each
/// batch's record ends in the ring's stream, with the rows written up to it.
fn produce_batches(
    producer: &mut sluice_ring::Producer,
    path: &std::path::Path,
    rows: i64,
) -> Vec<(u64, i64)> {
    let mut encoder = sluice_client::Encoder::new(batch(0, 1).schema()).expect("encoder");
    encoder.write_schema_file(path).expect("schema file");
    encoder.write_schema(producer).expect("schema");
    let mut ends = Vec::new();
    for first in (0..rows).step_by(97) {
        let count = 97.min(rows - first);
        encoder
            .write_batch(
                producer,
                &batch(first, count),
                3,
                first as u64,
                count as u64,
            )
            .expect("batch");
        ends.push((producer.position(), first + count));
    }
    ends
}

/// The rows the ring counts as consumed when its read cursor stands at `read`: those of the batches
/// whose records end at or before it.
fn released_rows(ends: &[(u64, i64)], read: u64) -> i64 {
    let released = ends.partition_point(|(end, _)| *end <= read);
    released.checked_sub(1).map_or(0, |last| ends[last].1)
}

/// Whether process `pid` is stopped (its state in /proc is `T`).
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('T'))
    })
}

/// A trainer stopped at random moments until it stands between writing a batch's ids and releasing
/// the batch, killed there with SIGKILL, and started again on its ring and ids file, three times:
/// the ids file holds every id once, in the ring's order. A trainer that released first and
/// recorded after would lose the batch; one that recorded first and kept the ids on restart would
/// repeat it.
#[test]
fn a_trainer_killed_between_recording_a_batch_and_releasing_it_records_every_id_once() {
    const KILLED_ROWS: i64 = 1_000_000;
    /// Trainers killed in the window; the one after the last reads to the end.
    const CAUGHT: usize = 3;
    const CAPACITY: u64 = 64 << 10;
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join("0.ring");
    let ids = directory.path().join("ids.bin");
    // Records are placed by their sizes alone: a ring in memory of the same size, read as it is
    // written, tells where each batch will end in the trainers' ring.
    let ends = {
        let rehearsal = sluice_ring::Ring::in_memory(CAPACITY).expect("ring in memory");
        let mut producer = rehearsal.producer().expect("producer");
        let mut consumer = rehearsal.consumer().expect("consumer");
        let drain = std::thread::spawn(move || while consumer.next().expect("read").is_some() {});
        let schema = directory.path().join("rehearsal.ring");
        let ends = produce_batches(&mut producer, &schema, KILLED_ROWS);
        producer.close();
        drain.join().expect("drain");
        ends
    };
    // A small ring, so that the writer waits on the trainer.
    let ring = RingOptions::new(&path)
        .capacity(CAPACITY)
        .create()
        .expect("create ring");
    let mut producer = ring.producer().expect("producer");
    let writer = std::thread::spawn({
        let path = path.clone();
        move || {
            produce_batches(&mut producer, &path, KILLED_ROWS);
            let slot = producer.reserve(0).expect("reserve");
            slot.commit(RecordMeta::of_kind(RecordKind::EndOfEpoch));
            producer.close();
        }
    });
    let trainer = || {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["consume", "--ids-out"])
            .arg(&ids)
            .env("SLUICE_RING", &path)
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sluice consume")
    };
    let recorded = || std::fs::metadata(&ids).map_or(0, |file| file.len() as i64 / 8);
    // Asked of a stopped trainer only, whose ids file and ring stand still.
    let between = || recorded() != released_rows(&ends, ring.cursors().1);
    let signal = |pid: u32, signal: libc::c_int| {
        sluice_process::ProcessId::signal_group_id(pid, signal).expect("signal the trainer");
    };
    let mut caught = 0;
    let mut kills = 0;
    let mut stderr = String::new();
    let last = 'trainers: loop {
        let mut running = trainer();
        if caught == CAUGHT {
            break running.wait_with_output().expect("the last trainer");
        }
        let pid = running.id();
        let before = recorded();
        let started = std::time::Instant::now();
        while recorded() < before + 1_000 {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(30),
                "a trainer recorded no new ids within 30 s"
            );
            if let Ok(Some(_)) = running.try_wait() {
                // The ring's data ran out first: this trainer was the last.
                break 'trainers running.wait_with_output().expect("the last trainer");
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // Stopped at random moments until one finds its ids file and the ring's read cursor
        // disagreeing, between writing a batch's ids and releasing it, where it is then killed. A
        // trainer not caught there within two seconds is killed wherever it is.
        let watching = std::time::Instant::now();
        let mut jitter = u64::from(pid);
        while watching.elapsed() < std::time::Duration::from_secs(2) {
            signal(pid, libc::SIGSTOP);
            while !is_stopped(pid) {
                if let Ok(Some(_)) = running.try_wait() {
                    // The ring's data ran out first: this trainer was the last.
                    break 'trainers running.wait_with_output().expect("the last trainer");
                }
                std::thread::yield_now();
            }
            if between() {
                caught += 1;
                break;
            }
            signal(pid, libc::SIGCONT);
            jitter = jitter
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            std::thread::sleep(std::time::Duration::from_micros(jitter >> 55));
        }
        kills += 1;
        signal(pid, libc::SIGKILL);
        let output = running.wait_with_output().expect("reap the trainer");
        stderr += &String::from_utf8_lossy(&output.stderr);
    };
    writer.join().expect("the writer");
    stderr += &String::from_utf8_lossy(&last.stderr);
    assert!(last.status.success(), "the last trainer failed: {stderr}");
    let seen = ids_in(&ids);
    if !seen.iter().copied().eq(0..KILLED_ROWS) {
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        panic!(
            "not every id once, in the ring's order, through {kills} kills ({caught} between a \
             batch's record and its release): {} ids, the first missing {:?}, the first repeated \
             {:?}",
            seen.len(),
            (0..KILLED_ROWS).find(|id| sorted.binary_search(id).is_err()),
            sorted
                .windows(2)
                .find(|pair| pair[0] == pair[1])
                .map(|pair| pair[0])
        );
    }
    assert!(
        caught > 0,
        "none of {kills} trainers was killed between a batch's record and its release, where its \
         ids and its ring disagree: the test proved little"
    );
    let cuts = stderr.matches("sluice consume: cut ").count();
    assert!(
        cuts >= caught,
        "{caught} trainers were killed between a batch's record and its release, and the trainers \
         started after them cut ids {cuts} times: {stderr}"
    );
}

#[test]
fn a_ring_that_never_appears_is_a_clear_error() {
    let directory = tempfile::tempdir().expect("tempdir");
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["consume", "--wait-s", "0", "--ring"])
        .arg(directory.path().join("missing.ring"))
        .output()
        .expect("run sluice consume");
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("no ring at"), "{message}");
    assert!(message.contains("SLUICE_RING"), "{message}");
}

#[test]
fn a_file_that_is_not_a_ring_is_refused_at_once_without_waiting() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join("0.ring");
    std::fs::write(&path, b"not a ring").expect("write");
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["consume", "--wait-s", "600", "--ring"])
        .arg(&path)
        .output()
        .expect("run sluice consume");
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(
        message.contains("truncated or not a sluice ring"),
        "{message}"
    );
    assert!(!message.contains("waiting up to"), "{message}");
}

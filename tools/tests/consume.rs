//! `sluice consume`, the reference trainer, as a process reading a real ring that this test fills.

use std::io::{BufRead, BufReader};
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

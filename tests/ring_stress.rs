//! Ten million records of random sizes between two processes over a real ring in /dev/shm: no loss,
//! no reordering, no duplicate, no corrupted byte.

use std::process::{Command, Stdio};
use std::time::Duration;

use sluice_ring::RingOptions;
use sluice_tests::wait_with_deadline;

const RECORDS: u64 = if cfg!(miri) { 50 } else { 10_000_000 };

#[test]
fn ten_million_records_cross_processes_intact() {
    let directory = tempfile::Builder::new()
        .prefix("sluice-stress")
        .tempdir_in("/dev/shm")
        .expect("tempdir in /dev/shm");
    let path = directory.path().join("0.ring");
    // A small ring, so that it wraps every few thousand records and both sides wait on each other.
    drop(
        RingOptions::new(&path)
            .capacity(1 << 20)
            .create()
            .expect("create"),
    );
    let seed = 0x5EED_0001;
    let peer = env!("CARGO_BIN_EXE_ring-peer");
    let mut consumer = Command::new(peer)
        .args([
            "consume",
            path.to_str().expect("utf-8 path"),
            &RECORDS.to_string(),
            &seed.to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn consumer");
    let mut producer = Command::new(peer)
        .args([
            "produce",
            path.to_str().expect("utf-8 path"),
            &RECORDS.to_string(),
            &seed.to_string(),
        ])
        .spawn()
        .expect("spawn producer");
    let limit = Duration::from_secs(600);
    assert!(wait_with_deadline(&mut producer, limit, "producer").success());
    assert!(wait_with_deadline(&mut consumer, limit, "consumer").success());
    let output = std::io::read_to_string(consumer.stdout.take().expect("stdout")).expect("read");
    assert_eq!(output.trim(), format!("ok {RECORDS}"));
}

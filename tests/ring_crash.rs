//! The producer is killed with SIGKILL at random points, many times, and a new one reattaches each
//! time; the consumer, its own process, must see every published record exactly once, in order, and no
//! producer may start below what the one before it had published. Commits a producer had not published
//! when it died are lost with it, and its successor writes those records again. Every producer keeps the
//! ring's ledger: the records it folds must continue the ledger's consumed count with no gap across the
//! kills, and the count must end at exactly the number of records.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_ring::RingOptions;
use sluice_tests::{mix, wait_with_deadline};

const RECORDS: u64 = 5_000_000;
const KILLS: u32 = 40;

#[test]
fn killed_producers_lose_and_repeat_nothing() {
    let directory = tempfile::Builder::new()
        .prefix("sluice-crash")
        .tempdir_in("/dev/shm")
        .expect("tempdir in /dev/shm");
    let path = directory.path().join("0.ring");
    drop(
        RingOptions::new(&path)
            .capacity(256 << 10)
            .create()
            .expect("create"),
    );
    let path = path.to_str().expect("utf-8 path").to_owned();
    let seed = 0x5EED_0002;
    let peer = env!("CARGO_BIN_EXE_ring-peer");
    let mut consumer = Command::new(peer)
        .args(["consume", &path, &RECORDS.to_string(), &seed.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn consumer");

    let mut random = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64;
    eprintln!("kill schedule seed {random}");
    let mut killed_mid_stream = 0;
    let mut starts = Vec::new();
    let mut published = Vec::new();
    for _ in 0..KILLS {
        let mut producer = Command::new(peer)
            .args([
                "produce",
                &path,
                &RECORDS.to_string(),
                &seed.to_string(),
                "--report-published",
                "--ledger",
            ])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn producer");
        let mut stderr_pipe = BufReader::new(producer.stderr.take().expect("stderr"));
        let mut stderr = String::new();
        random = mix(random);
        if !random.is_multiple_of(8) {
            // Most kills land after the producer has attached, however slowly the machine starts
            // processes; the rest may land during the attach itself.
            while stderr_pipe.read_line(&mut stderr).expect("read") > 0
                && !stderr.contains("producer starts at ")
            {}
        }
        random = mix(random);
        std::thread::sleep(Duration::from_micros(500 + random % 15_000));
        producer.kill().expect("SIGKILL");
        let status = producer.wait().expect("wait");
        stderr_pipe.read_to_string(&mut stderr).expect("read");
        if let Some(start) = stderr
            .lines()
            .find_map(|line| line.strip_prefix("producer starts at "))
        {
            starts.push(start.parse::<u64>().expect("a number"));
            let last_published = stderr
                .lines()
                .filter_map(|line| line.strip_prefix("published "))
                .map(|count| count.parse::<u64>().expect("a number"))
                .max();
            published.push(last_published.unwrap_or(starts[starts.len() - 1]));
        }
        if status.code().is_none() {
            killed_mid_stream += 1;
        } else {
            assert!(status.success(), "producer failed: {stderr}");
            break;
        }
    }
    let mut last = Command::new(peer)
        .args([
            "produce",
            &path,
            &RECORDS.to_string(),
            &seed.to_string(),
            "--ledger",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the last producer");
    let limit = Duration::from_secs(600);
    let last_status = wait_with_deadline(&mut last, limit, "last producer");
    let last_stderr = std::io::read_to_string(last.stderr.take().expect("stderr")).expect("read");
    assert!(last_status.success(), "last producer: {last_stderr}");
    assert!(
        last_stderr
            .lines()
            .any(|line| line == format!("ledger consumed {RECORDS}")),
        "the ledger does not count every record consumed: {last_stderr}"
    );
    assert!(wait_with_deadline(&mut consumer, limit, "consumer").success());
    let output = std::io::read_to_string(consumer.stdout.take().expect("stdout")).expect("read");
    assert_eq!(output.trim(), format!("ok {RECORDS}"));

    assert!(
        killed_mid_stream >= KILLS / 2,
        "only {killed_mid_stream} producers were killed before the stream ended: the test proves little"
    );
    for (index, pair) in starts.windows(2).enumerate() {
        assert!(
            pair[1] >= published[index],
            "producer {} started at {} below the {} records its predecessor published: {starts:?} {published:?}",
            index + 1,
            pair[1],
            published[index]
        );
    }
    assert!(
        starts.iter().filter(|start| **start > 0).count() >= (KILLS / 2) as usize,
        "producers rarely resumed past record 0: {starts:?}"
    );
    assert!(
        starts
            .iter()
            .zip(&published)
            .filter(|(start, published)| published > start)
            .count()
            >= (KILLS / 2) as usize,
        "producers rarely published before they were killed: {starts:?} {published:?}"
    );
}

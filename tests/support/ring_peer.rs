//! One side of a multi-process ring test, run as its own process.
//!
//! `ring-peer produce PATH COUNT SEED [--report-published]` attaches as the producer (taking over from a
//! dead one) and writes records until the stream holds COUNT of them, then closes it; with
//! `--report-published` it prints `published N` on stderr each time its published sequence moves to N. `ring-peer consume PATH COUNT SEED`
//! attaches as the consumer, checks every record, and prints `ok COUNT` when the stream ends with exactly
//! COUNT records. Any error prints a message and exits 1.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use sluice_ring::{RecordKind, RecordMeta, Ring};
use sluice_tests::{check_record, fill_record, record_len};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (positional, report_published) = match args.as_slice() {
        [positional @ .., flag] if flag == "--report-published" => (positional, true),
        positional => (positional, false),
    };
    let parsed = match positional {
        [_, role, path, count, seed] => count
            .parse::<u64>()
            .ok()
            .zip(seed.parse::<u64>().ok())
            .map(|(count, seed)| (role.as_str(), path.as_str(), count, seed)),
        _ => None,
    };
    let Some((role, path, count, seed)) = parsed else {
        eprintln!("usage: ring-peer produce|consume PATH COUNT SEED [--report-published]");
        return ExitCode::FAILURE;
    };
    let result = match role {
        "produce" => produce(path, count, seed, report_published),
        "consume" => consume(path, count, seed),
        other => Err(format!("unknown role {other}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("ring-peer {role}: {message}");
            ExitCode::FAILURE
        }
    }
}

fn produce(path: &str, count: u64, seed: u64, report_published: bool) -> Result<(), String> {
    let ring = Ring::open(path).map_err(|error| error.to_string())?;
    let mut producer = ring.producer().map_err(|error| error.to_string())?;
    eprintln!("producer starts at {}", producer.next_sequence());
    let mut reported = producer.published_sequence();
    while producer.next_sequence() < count {
        let sequence = producer.next_sequence();
        let mut slot = producer
            .reserve(record_len(seed, sequence))
            .map_err(|error| error.to_string())?;
        fill_record(seed, sequence, slot.payload_mut());
        slot.commit(RecordMeta {
            kind: RecordKind::Batch,
            task_id: 1,
            first_row: sequence,
            row_count: 1,
        });
        if report_published && producer.published_sequence() != reported {
            reported = producer.published_sequence();
            // One write per line, so that a SIGKILL never leaves half a line behind.
            std::io::stderr()
                .write_all(format!("published {reported}\n").as_bytes())
                .map_err(|error| format!("reporting the published sequence: {error}"))?;
        }
    }
    producer.close();
    Ok(())
}

fn consume(path: &str, count: u64, seed: u64) -> Result<(), String> {
    let ring = Ring::open(path).map_err(|error| error.to_string())?;
    let mut consumer = ring.consumer().map_err(|error| error.to_string())?;
    consumer.set_peer_timeout(Duration::from_secs(30));
    let mut expected = 0u64;
    while let Some(record) = consumer.next().map_err(|error| error.to_string())? {
        if record.sequence() != expected {
            return Err(format!(
                "ring sequence {} where {expected} was expected",
                record.sequence()
            ));
        }
        check_record(seed, expected, record.payload())?;
        if record.meta().first_row != expected {
            return Err(format!(
                "record {expected}: metadata says row {}",
                record.meta().first_row
            ));
        }
        expected += 1;
    }
    if expected != count {
        return Err(format!(
            "stream ended after {expected} records, expected {count}"
        ));
    }
    println!("ok {expected}");
    Ok(())
}

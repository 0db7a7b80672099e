//! One side of a multi-process ring test, run as its own process.
//!
//! `ring-peer produce PATH COUNT SEED [--report-published] [--ledger]` attaches as the producer (taking
//! over from a dead one) and writes records until the stream holds COUNT of them, then closes it; with
//! `--report-published` it prints `published N` on stderr each time its published sequence moves to N.
//! With `--ledger` it keeps the ring's ledger: every record is row `sequence` of task 1, each record it
//! folds must continue the ledger's consumed count with no gap, and before it closes the stream it waits
//! for the consumer to release every record, folds them, and prints `ledger consumed N` on stderr.
//! `ring-peer consume PATH COUNT SEED` attaches as the consumer, checks every record, and prints
//! `ok COUNT` when the stream ends with exactly COUNT records. Any error prints a message and exits 1.

#![forbid(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_ring::ledger::{Ledger, LedgerTask};
use sluice_ring::{Producer, RecordKind, RecordMeta, Ring};
use sluice_tests::{check_record, fill_record, record_len};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let report_published = args.iter().any(|arg| arg == "--report-published");
    let ledger = args.iter().any(|arg| arg == "--ledger");
    let positional: Vec<&String> = args.iter().filter(|arg| !arg.starts_with("--")).collect();
    let parsed = match positional.as_slice() {
        [_, role, path, count, seed] => count
            .parse::<u64>()
            .ok()
            .zip(seed.parse::<u64>().ok())
            .map(|(count, seed)| (role.as_str(), path.as_str(), count, seed)),
        _ => None,
    };
    let Some((role, path, count, seed)) = parsed else {
        eprintln!(
            "usage: ring-peer produce|consume PATH COUNT SEED [--report-published] [--ledger]"
        );
        return ExitCode::FAILURE;
    };
    let result = match role {
        "produce" => produce(path, count, seed, report_published, ledger),
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

fn produce(
    path: &str,
    count: u64,
    seed: u64,
    report_published: bool,
    keep_ledger: bool,
) -> Result<(), String> {
    let ring = Ring::open(path).map_err(|error| error.to_string())?;
    let mut producer = ring.producer().map_err(|error| error.to_string())?;
    eprintln!("producer starts at {}", producer.next_sequence());
    let ledger = keep_ledger
        .then(|| attach_ledger(&ring, &mut producer, count))
        .transpose()?;
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
            tag: 0,
        });
        if let Some((_, gap)) = &ledger
            && let Some(message) = gap.lock().expect("lock").take()
        {
            return Err(message);
        }
        if report_published && producer.published_sequence() != reported {
            reported = producer.published_sequence();
            // One write per line, so that a SIGKILL never leaves half a line behind.
            std::io::stderr()
                .write_all(format!("published {reported}\n").as_bytes())
                .map_err(|error| format!("reporting the published sequence: {error}"))?;
        }
    }
    if let Some((ledger, gap)) = ledger {
        producer.flush();
        while producer.fold().map_err(|error| error.to_string())? < producer.position() {
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Some(message) = gap.lock().expect("lock").take() {
            return Err(message);
        }
        let task = ledger.task(1).ok_or("task 1 is not bound in the ledger")?;
        eprintln!("ledger consumed {}", task.consumed_end);
    }
    producer.close();
    Ok(())
}

/// Where the fold hook leaves the message of a gap it found.
type GapReport = Arc<Mutex<Option<String>>>;

/// Opens the ring's ledger (creating it with task 1 bound on the first run) and folds into it,
/// checking that every folded record continues the consumed count with no gap. Returns the ledger and
/// where a gap is reported.
fn attach_ledger(
    ring: &Ring,
    producer: &mut Producer,
    count: u64,
) -> Result<(Arc<Ledger>, GapReport), String> {
    let path = Ledger::path_beside(ring.path());
    let ledger = match Ledger::open(&path) {
        Ok(ledger) => ledger,
        Err(_) if producer.next_sequence() == 0 && !path.exists() => {
            let ledger = Ledger::create(&path, 0).map_err(|error| error.to_string())?;
            ledger
                .bind(
                    &LedgerTask {
                        task_id: 1,
                        epoch: 0,
                        start: 0,
                        end: count,
                        consumed_end: 0,
                        enqueued_end: 0,
                    },
                    // Before the first record: every record of the ring is the task's.
                    0,
                )
                .map_err(|error| error.to_string())?;
            ledger
        }
        Err(error) => return Err(error.to_string()),
    };
    let ledger = Arc::new(ledger);
    let gap = Arc::new(Mutex::new(None));
    let (hook_ledger, hook_gap) = (ledger.clone(), gap.clone());
    producer.set_fold_hook(move |meta, position| {
        let consumed = hook_ledger.task(1).map_or(0, |task| task.consumed_end);
        if meta.first_row > consumed {
            *hook_gap.lock().expect("lock") = Some(format!(
                "folded row {} while the ledger had consumed {consumed}: a released record was never folded",
                meta.first_row
            ));
        }
        hook_ledger.fold(meta, position);
    });
    producer.fold().map_err(|error| error.to_string())?;
    Ok((ledger, gap))
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

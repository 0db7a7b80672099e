//! A journal writer for the crash tests: appends the numbers 0, 1, 2, ... to a journal as fast as
//! it can, with up to `WINDOW` appends in flight, and prints each number once it is durable.
//!
//! Usage: `journal-writer URI [KEY=VALUE ...]` (storage options). It first checks what it recovered
//! (the latest snapshot `s` then exactly `s, s + 1, ...`), prints `recovered <next number>`, and goes
//! on from there. Every `SNAPSHOT_EVERY` numbers it snapshots the next number. It runs until killed.

#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::io::Write;
use std::process::ExitCode;

use sluice_am::journal::{self, Durable, JournalConfig, StorageOptions};
use sluice_tests::Count;

/// Appends in flight (appended, not yet printed) at most.
const WINDOW: u64 = 512;
/// Numbers between snapshots.
const SNAPSHOT_EVERY: u64 = 5_000;

fn main() -> ExitCode {
    let mut arguments = std::env::args().skip(1);
    let Some(uri) = arguments.next() else {
        eprintln!("usage: journal-writer URI [KEY=VALUE ...]");
        return ExitCode::from(2);
    };
    let mut options = StorageOptions::new();
    for option in arguments {
        let Some((key, value)) = option.split_once('=') else {
            eprintln!("journal-writer: storage option {option:?} is not KEY=VALUE");
            return ExitCode::from(2);
        };
        options.insert(key.to_string(), value.to_string());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(write_numbers(&uri, &options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("journal-writer: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn write_numbers(uri: &str, options: &StorageOptions) -> Result<(), String> {
    let (journal, recovered) = journal::open::<u64, Count>(
        uri,
        options,
        JournalConfig::new("journal-crash").writer("journal-writer"),
    )
    .await
    .map_err(|error| error.to_string())?;
    let start = recovered.snapshot.map_or(0, |Count(count)| count);
    for (index, &number) in recovered.entries.iter().enumerate() {
        if number != start + index as u64 {
            return Err(format!(
                "recovered entry {index} after snapshot {start} is {number}, expected {}",
                start + index as u64
            ));
        }
    }
    let mut next = start + recovered.entries.len() as u64;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "recovered {next}").map_err(|error| error.to_string())?;
    stdout.flush().map_err(|error| error.to_string())?;

    let mut in_flight: VecDeque<(Option<u64>, Durable)> = VecDeque::new();
    let mut unprinted = 0;
    let mut printed = String::new();
    loop {
        while unprinted < WINDOW {
            in_flight.push_back((Some(next), journal.append(&next)));
            next += 1;
            unprinted += 1;
            if next.is_multiple_of(SNAPSHOT_EVERY) {
                in_flight.push_back((None, journal.snapshot(Count(next))));
            }
        }
        // Durables resolve in order: await the oldest, then take every one already resolved.
        let (number, durable) = in_flight.pop_front().expect("the window is full");
        durable.await.map_err(|error| error.to_string())?;
        let mut resolved = vec![number];
        while let Some((_, durable)) = in_flight.front_mut() {
            match futures::FutureExt::now_or_never(&mut *durable) {
                Some(outcome) => {
                    outcome.map_err(|error| error.to_string())?;
                    resolved.push(in_flight.pop_front().expect("a front").0);
                }
                None => break,
            }
        }
        printed.clear();
        for number in resolved.into_iter().flatten() {
            printed.push_str(&number.to_string());
            printed.push('\n');
            unprinted -= 1;
        }
        stdout
            .write_all(printed.as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(|error| error.to_string())?;
    }
}

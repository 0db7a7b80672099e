//! `sluice demo`: moves records between two processes through a real ring in /dev/shm, checks every
//! byte on the reading side, and prints the throughput of both sides.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail, ensure};
use clap::Args;
use sluice_ring::{RecordKind, RecordMeta, Ring, RingOptions};

/// Arguments of `sluice demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The directory for the demo's ring (default: /dev/shm/sluice-<uid>).
    #[arg(long, default_value_os_t = sluice_ring::default_ring_dir())]
    dir: PathBuf,
    /// Records to move.
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Payload bytes per record (a multiple of 8, at least 16).
    #[arg(long, default_value_t = 4096)]
    size: usize,
    /// Reads the ring at this path as the demo's consumer (the demo starts itself this way).
    #[arg(long, hide = true)]
    consume: Option<PathBuf>,
}

/// Runs the demo, or its consuming side with `--consume`.
pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    ensure!(
        args.size >= 16 && args.size.is_multiple_of(8),
        "--size {}: must be a multiple of 8, at least 16",
        args.size
    );
    match &args.consume {
        Some(path) => consume(path, &args),
        None => produce(&args),
    }
}

fn produce(args: &DemoArgs) -> anyhow::Result<()> {
    let path = args
        .dir
        .join(format!("demo-{}", std::process::id()))
        .join("0.ring");
    let ring = RingOptions::new(&path).capacity(64 << 20).create()?;
    let result = produce_into(&ring, &path, args);
    let _ = std::fs::remove_dir_all(path.parent().expect("the ring lies in its job directory"));
    result
}

fn produce_into(ring: &Ring, path: &Path, args: &DemoArgs) -> anyhow::Result<()> {
    println!(
        "ring {} ({} MiB): {} records of {} bytes, producer pid {}",
        path.display(),
        ring.capacity() >> 20,
        args.records,
        args.size,
        std::process::id()
    );
    let mut consumer = Command::new(std::env::current_exe().context("locating the sluice binary")?)
        .args([
            "demo",
            "--records",
            &args.records.to_string(),
            "--size",
            &args.size.to_string(),
        ])
        .arg("--consume")
        .arg(path)
        .stdout(Stdio::inherit())
        .spawn()
        .context("starting the consumer process")?;
    let mut producer = ring.producer()?;
    let started = Instant::now();
    for sequence in 0..args.records {
        let mut slot = producer.reserve(args.size)?;
        fill(sequence, slot.payload_mut());
        slot.commit(RecordMeta {
            kind: RecordKind::Batch,
            task_id: 0,
            first_row: sequence,
            row_count: 1,
            tag: 0,
        });
    }
    let elapsed = started.elapsed();
    let full_wait = producer.full_wait();
    producer.close();
    let status = consumer.wait().context("waiting for the consumer")?;
    if !status.success() {
        bail!("the consumer process failed ({status})");
    }
    println!(
        "producer: {} records in {:.2} s, {:.0} records/s, {:.2} GB/s, waited {:.2} s on a full ring",
        args.records,
        elapsed.as_secs_f64(),
        args.records as f64 / elapsed.as_secs_f64(),
        (args.records * args.size as u64) as f64 / elapsed.as_secs_f64() / 1e9,
        full_wait.as_secs_f64()
    );
    Ok(())
}

fn consume(path: &Path, args: &DemoArgs) -> anyhow::Result<()> {
    let ring = Ring::open(path)?;
    let mut consumer = ring.consumer()?;
    let started = Instant::now();
    let mut expected = 0u64;
    while let Some(record) = consumer.next()? {
        ensure!(
            record.sequence() == expected && record.meta().first_row == expected,
            "record {} arrived where {expected} was expected",
            record.sequence()
        );
        check(expected, record.payload())?;
        expected += 1;
    }
    ensure!(
        expected == args.records,
        "the stream ended after {expected} of {} records",
        args.records
    );
    let elapsed = started.elapsed();
    println!(
        "consumer (pid {}): {expected} records in {:.2} s, {:.2} GB/s, every byte checked, in order, none missing",
        std::process::id(),
        elapsed.as_secs_f64(),
        (expected * args.size as u64) as f64 / elapsed.as_secs_f64() / 1e9
    );
    Ok(())
}

fn word(sequence: u64, index: usize) -> u64 {
    sequence.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index as u64
}

fn fill(sequence: u64, payload: &mut [u8]) {
    for (index, chunk) in payload.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&word(sequence, index).to_le_bytes());
    }
}

fn check(sequence: u64, payload: &[u8]) -> anyhow::Result<()> {
    for (index, chunk) in payload.chunks_exact(8).enumerate() {
        let found = u64::from_le_bytes(chunk.try_into().expect("chunks of 8"));
        ensure!(
            found == word(sequence, index),
            "record {sequence}: byte {} differs",
            index * 8
        );
    }
    Ok(())
}

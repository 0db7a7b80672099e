//! `sluice consume`: the reference trainer. It reads its ring, releases each batch, and records
//! the ids it saw.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use arrow::array::{Array, AsArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Int64Type};
use sluice_client::{Item, Reader};
use sluice_ring::Ring;

/// Arguments of `sluice consume`.
#[derive(Debug, clap::Args)]
pub struct ConsumeArgs {
    /// The ring to read.
    #[arg(long, env = "SLUICE_RING")]
    pub ring: PathBuf,
    /// Append every id seen to this file, as little-endian int64.
    #[arg(long)]
    pub ids_out: Option<PathBuf>,
    /// The integer column `--ids-out` records.
    #[arg(long, default_value = "id")]
    pub id_column: String,
    /// Read at most this many rows per second, like a trainer's compute would.
    #[arg(long)]
    pub max_rows_per_s: Option<f64>,
    /// How long to wait for the daemon to create the ring.
    #[arg(long, default_value_t = 60)]
    pub wait_s: u64,
}

/// Reads the ring to its end; prints rows and rows/s.
pub fn run(args: ConsumeArgs) -> anyhow::Result<()> {
    let ring = open_when_created(&args.ring, Duration::from_secs(args.wait_s))?;
    let consumer = ring
        .consumer()
        .with_context(|| format!("ring {}: taking the consumer role", args.ring.display()))?;
    let mut reader = Reader::new(consumer);
    let mut ids_out = match &args.ids_out {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening --ids-out {}", path.display()))?,
        )),
        None => None,
    };
    let started = Instant::now();
    let mut rows = 0u64;
    while let Some(item) = reader
        .next_item()
        .with_context(|| format!("ring {}", args.ring.display()))?
    {
        let Item::Batch { batch, .. } = item else {
            continue;
        };
        rows += batch.num_rows() as u64;
        if let Some(out) = &mut ids_out {
            let column = batch.column_by_name(&args.id_column).with_context(|| {
                format!(
                    "--ids-out: the batches have no column `{}`; name an integer column with --id-column",
                    args.id_column
                )
            })?;
            let ids = cast(column, &DataType::Int64)
                .ok()
                .filter(|_| column.data_type().is_integer())
                .with_context(|| {
                    format!(
                        "--ids-out: column `{}` is {}, not an integer column; name one with --id-column",
                        args.id_column,
                        column.data_type()
                    )
                })?;
            for id in ids.as_primitive::<Int64Type>().iter().flatten() {
                out.write_all(&id.to_le_bytes())?;
            }
        }
        if let Some(limit) = args.max_rows_per_s {
            let due = Duration::from_secs_f64(rows as f64 / limit.max(1e-9));
            if let Some(ahead) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(ahead);
            }
        }
    }
    if let Some(out) = &mut ids_out {
        out.flush()?;
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{{\"rows\":{rows},\"seconds\":{seconds:.3},\"rows_per_s\":{:.0}}}",
        rows as f64 / seconds.max(1e-9)
    );
    Ok(())
}

/// Opens the ring, waiting up to `limit` for the daemon to create it.
fn open_when_created(path: &std::path::Path, limit: Duration) -> anyhow::Result<Ring> {
    let started = Instant::now();
    loop {
        match Ring::open(path) {
            Ok(ring) => return Ok(ring),
            Err(_) if !path.exists() && started.elapsed() < limit => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(error) => {
                return Err(anyhow::Error::new(error).context(format!(
                    "no ring at {} after {} s; check SLUICE_RING (or --ring) and that the node daemon runs",
                    path.display(),
                    limit.as_secs()
                )));
            }
        }
    }
}

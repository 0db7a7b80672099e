//! `sluice consume`: the reference trainer. It reads its ring, releases each batch, and records
//! the ids it saw.
//!
//! The ids file holds the ids of exactly the batches the ring counts as consumed: each batch's ids
//! go out, with where its record ends in the ring, before the batch is released, and a trainer
//! started again on the same file cuts the ids of batches whose release the ring did not count
//! (see [`ids_record`]). On SIGTERM (the AM stopping its trainers for a scale) the trainer ends
//! after the batch it holds, with the ring's read cursor published, and exits with 143. Killed
//! with SIGKILL instead, it leaves the batch it held, and any whose release it had not published,
//! to the next trainer of the ring, which reads on from the read cursor.

mod ids_record;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Int64Type};
use sluice_client::{Item, Reader};
use sluice_ring::Ring;
use sluice_ring::announce::Announcement;

use crate::cmd::am::AmAddress;
use crate::cmd::read::runtime;
use ids_record::{IdsRecord, RingIdentity, TaskRows};

/// Arguments of `sluice consume`.
#[derive(Debug, clap::Args)]
pub struct ConsumeArgs {
    /// The ring to read. Without it, the trainer was launched by someone else (torchrun, srun):
    /// it takes its ranks from RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE (or SLURM_PROCID,
    /// SLURM_LOCALID, SLURM_NTASKS, or SLUICE_RANK), announces itself to its node's daemon, and
    /// reads <ring-dir>/<job>/<local rank>.ring.
    #[arg(long, env = "SLUICE_RING")]
    pub ring: Option<PathBuf>,
    /// Where the node's daemon keeps its rings (its --ring-dir), for a trainer with no --ring.
    #[arg(long, env = "SLUICE_RING_DIR", default_value_os_t = sluice_ring::default_ring_dir())]
    pub ring_dir: PathBuf,
    /// The job, for a trainer with no --ring; by default the job the AM at --am runs.
    #[arg(long, env = "SLUICE_JOB")]
    pub job: Option<String>,
    #[command(flatten)]
    pub address: AmAddress,
    /// Append every id seen to this file, as little-endian int64; FILE.positions beside it places
    /// each batch's ids in the ring, so that the trainer started again on FILE keeps exactly the
    /// ids of the batches the ring counts as consumed.
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

/// The exit code of a trainer that ended on SIGTERM, as a shell reports it: 128 + 15.
const TERMINATED: u8 = 128 + 15;

/// Reads the ring to its end, or up to a SIGTERM; prints rows and rows/s.
pub fn run(args: ConsumeArgs) -> anyhow::Result<ExitCode> {
    let terminated = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&terminated))
        .context("handling SIGTERM")?;
    let path = match &args.ring {
        Some(path) => path.clone(),
        None => attach(&args)?,
    };
    let ring = open_when_created(&path, Duration::from_secs(args.wait_s))?;
    let consumer = ring
        .consumer()
        .with_context(|| format!("ring {}: taking the consumer role", path.display()))?;
    let mut reader = Reader::new(consumer);
    // Opened once the consumer role is taken: the read cursor then stands where the releases of
    // the ring's earlier trainers stopped, and moves only with this one's.
    let mut ids_out = match &args.ids_out {
        Some(ids) => {
            let (record, reopened) =
                IdsRecord::open(ids, RingIdentity::of(&ring), reader.released())?;
            if reopened.cut > 0 {
                eprintln!(
                    "sluice consume: cut {} ids from {}, keeping {}: the trainer before this one recorded their batches but was gone before it released them, and the ring gives them again",
                    reopened.cut,
                    ids.display(),
                    reopened.kept
                );
            }
            Some(record)
        }
        None => None,
    };
    let started = Instant::now();
    let mut rows = 0u64;
    let mut stopped = false;
    while let Some(item) = reader
        .next_item()
        .with_context(|| format!("ring {}", path.display()))?
    {
        let Item::Batch {
            batch,
            task_id,
            first_row,
            ..
        } = item
        else {
            continue;
        };
        rows += batch.num_rows() as u64;
        if let Some(record) = &mut ids_out
            && let Err(error) = ids_of(&batch, &args.id_column).and_then(|ids| {
                let ids = ids.as_primitive::<Int64Type>().iter().flatten();
                record.record(ids, reader.handed_out(), TaskRows { task_id, first_row })
            })
        {
            // Never released: the ring gives the batch to the next trainer, as after a kill.
            std::mem::forget(batch);
            return Err(error);
        }
        // Released only once its ids are recorded: a trainer killed before this line leaves the
        // batch to the next one, which cuts the ids recorded here.
        drop(batch);
        // Relaxed: the flag orders nothing else; the handler only sets it.
        if terminated.load(Ordering::Relaxed) {
            stopped = true;
            break;
        }
        if let Some(limit) = args.max_rows_per_s {
            let due = Duration::from_secs_f64(rows as f64 / limit.max(1e-9));
            if let Some(ahead) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(ahead);
            }
        }
    }
    // Publishes the read cursor of every batch released.
    drop(reader);
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{{\"rows\":{rows},\"seconds\":{seconds:.3},\"rows_per_s\":{:.0}}}",
        rows as f64 / seconds.max(1e-9)
    );
    if stopped {
        eprintln!("sluice consume: stopped by SIGTERM after {rows} rows");
        return Ok(ExitCode::from(TERMINATED));
    }
    Ok(ExitCode::SUCCESS)
}

/// The ids of `batch`: its integer column `id_column`, as int64s.
fn ids_of(batch: &arrow::array::RecordBatch, id_column: &str) -> anyhow::Result<ArrayRef> {
    let column = batch.column_by_name(id_column).with_context(|| {
        format!(
            "--ids-out: the batches have no column `{id_column}`; name an integer column with --id-column"
        )
    })?;
    cast(column, &DataType::Int64)
        .ok()
        .filter(|_| column.data_type().is_integer())
        .with_context(|| {
            format!(
                "--ids-out: column `{id_column}` is {}, not an integer column; name one with --id-column",
                column.data_type()
            )
        })
}

/// Announces a trainer that someone else launched to its node's daemon (see
/// `sluice_ring::announce`); returns the ring it reads.
fn attach(args: &ConsumeArgs) -> anyhow::Result<PathBuf> {
    let Some(trainer) = Announcement::from_env().map_err(anyhow::Error::msg)? else {
        anyhow::bail!(
            "no ring to read: pass --ring (or SLUICE_RING), or launch the trainer with torchrun or srun (RANK or SLURM_PROCID) or SLUICE_RANK, and SLUICE_AM"
        );
    };
    let (job, from) = match &args.job {
        Some(job) => (job.clone(), "--job (SLUICE_JOB)"),
        None => {
            let status = runtime(1)?.block_on(args.address.status())?;
            let expected: u32 = status.roles.iter().map(|role| role.num).sum();
            if expected != trainer.world_size {
                anyhow::bail!(
                    "job {} expects {expected} trainers in all (its roles' `num`), but this trainer's launcher says world size {}; launch as many trainers as the job spec's roles name",
                    status.job_id,
                    trainer.world_size
                );
            }
            (status.job_id, "the AM")
        }
    };
    if let Some((problem, fix)) = sluice_proto::slug_problem(&job, sluice_proto::JOB_NAME_MAX_LEN) {
        anyhow::bail!("{from} names the job {job:?}, which {problem}: {fix}");
    }
    let job_dir = args.ring_dir.join(&job);
    trainer
        .write(&job_dir)
        .with_context(|| format!("announcing the trainer in {}", job_dir.display()))?;
    Ok(job_dir.join(format!("{}.ring", trainer.local_rank)))
}

/// Opens the ring, waiting up to `limit` for the daemon to create it. Only an absent file is
/// waited for: the daemon links a ring into place whole, so any other failure is final.
fn open_when_created(path: &std::path::Path, limit: Duration) -> anyhow::Result<Ring> {
    let started = Instant::now();
    let mut announced = false;
    loop {
        match Ring::open(path) {
            Ok(ring) => return Ok(ring),
            Err(error) if error.is_absent() && started.elapsed() < limit => {
                if !announced {
                    eprintln!(
                        "sluice consume: waiting up to {} s for the ring at {}",
                        limit.as_secs(),
                        path.display()
                    );
                    announced = true;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(error) if error.is_absent() => anyhow::bail!(
                "no ring at {} after {} s; check SLUICE_RING (or --ring) and that the node daemon runs",
                path.display(),
                limit.as_secs()
            ),
            Err(error) => return Err(anyhow::Error::new(error)),
        }
    }
}

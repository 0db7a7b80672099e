//! `sluice-bench suite`: Sluice against the loaders users feed their trainers with today, side by
//! side, in one run, on the same data.
//!
//! The data is generated once by `sluice gen` into the cache directory (or is the user's, with
//! `--source`). The peers run in the suite's own Python environment (see [`python_env`]) unless
//! `--python` names another. Every system delivers the data's integer and floating-point columns, as
//! one dict of torch tensors per batch of [`BATCH_ROWS`] rows, to a Python trainer loop
//! (`benches/python/suite_trainer.py`, whose docs say how each peer is written):
//!
//! - `sluice`: the AM (`sluice am JOB`), one node daemon (`sluice daemon`) and the real ring, with the
//!   trainer reading `sluice.Reader`; `sluice_torch`: the same with the trainer iterating
//!   `DataLoader(sluice.torch.Dataset(), batch_size=None)`. The AM is serving before the trainer starts,
//!   and the daemon is started once the trainer has imported its modules and started its clock, so all
//!   of the daemon's work (its start, registering, acquiring tasks, fetch, decode, ring writes) falls in
//!   the trainer's window, as the start of a DataLoader's workers falls in its own;
//! - the loaders, each with 0, 1 and 2 workers (0 and 1 in a quick run), the worker count with the
//!   lowest data overhead being the system's figure: `pytorch_dataloader` (a Dataset of one dict of
//!   tensors per record batch), `torchdata` (its `StatefulDataLoader` over the same Dataset),
//!   `mosaic_streaming` (MDS samples of one batch each); and `pytorch_dataloader_naive` (one dict per
//!   row, collated), with none;
//! - `pyarrow`: a `pyarrow.dataset` scan in the trainer's process; `spdl`: an SPDL pipeline
//!   (`spdl.pipeline.PipelineBuilder`) in the trainer's process on a pool of 2 threads, its source the
//!   row groups, a stage of concurrency 2 reading each with pyarrow into record batches of
//!   [`BATCH_ROWS`] rows, a stage turning a row group's batches into tensors, then the batches one by
//!   one into a sink of 3; `ray_data`: Ray Data's `iter_torch_batches`, Ray started in the window;
//! - `ring` and `memcpy`: the ring benchmark's ring and memcpy at the size of one batch of this data as
//!   Arrow IPC, as the physical limit: rows/s = records/s × rows per batch.
//!
//! Phases: an idle trainer, then a trainer that computes `W` µs per batch for `W` = ½, 1 and 2 × the
//! daemon's CPU time per batch in the idle phase (`--work-us` to give it). Figures per system:
//!
//! - from the idle phase: rows/s over the trainer's window (from opening the reader or creating the
//!   iterator to the end of the data), steady rows/s after the first batch, the seconds to the first
//!   batch; CPU seconds per million rows within the window of every process of the system (see
//!   [`process_tree`]) and of the trainer's process alone;
//! - from a second idle run of its own, whose sampler also walks the processes' page tables (which
//!   takes CPU time from them, so the timed runs do without it): the peak of the sum of the
//!   processes' proportional set sizes, shared pages counted once (and the sum of their peak RSS);
//!   a remote run, bound by its link, samples them in its one idle run;
//! - from the work phases: the data overhead, the epoch time over the trainer's pure compute time
//!   (batches × W), at each W; the stall %, the time the trainer waited for a batch after the first
//!   over its time after the first, at W = the daemon's CPU per batch.
//!
//! Rounds rotate the order of the systems; the figures are the medians over the rounds. The ring and
//! memcpy have no processes or trainer of their own: their other figures are `None` (`null` in the
//! JSON, `-` in the table).
//!
//! # Remote data
//!
//! With `--remote` ([`SuiteOptions::remote`]), the same systems read the data from a real S3 server
//! behind a delaying, bandwidth-capped proxy (see [`remote`]): the suite starts both, uploads the
//! Parquet files (and the MDS copy) once, past the proxy, and every system reads S3 its own way
//! through the proxy: Sluice's AM and daemon with `object_store` (the job's source has the proxy's
//! endpoint in its storage options); `pyarrow`, the DataLoaders, torchdata, SPDL and Ray Data with
//! `pyarrow.fs.S3FileSystem` at the proxy; MosaicML Streaming with its `remote` on S3 (boto3 at
//! `S3_ENDPOINT_URL`) and a local cache directory that is empty at the start of each run. A remote
//! run has the idle phase only: it asks how many rows per second each system makes of the link.
//! Figures per system beside the idle phase's: the bytes the proxy handed to the system's processes
//! over its run, and the link fraction, the bytes it handed them within the trainer's window over
//! what the link carries in that time (bandwidth × window). The physical limit is the link (`link`):
//! its bandwidth over the Parquet bytes per row of the delivered columns, the least a Parquet reader
//! fetches.

pub mod chart;
pub mod process_tree;
pub mod python_env;
pub mod remote;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::command::{Spread, check_pyarrow, display, format_load, load_average, run_sampled};
use crate::error::{BenchError, Result};
use crate::peer::PeerCommand;
use crate::transport::Transport;
use crate::{RingBenchOptions, TransportBench};
use process_tree::{Sampling, TreeProcess, TreeSampler, TreeSamples};
use remote::{RemoteOptions, RemoteStore};

/// Rows per batch for every system, a common training batch.
pub const BATCH_ROWS: usize = 4096;
/// The worker counts of the loaders that are run.
pub const DATALOADER_WORKERS: [u32; 3] = [0, 1, 2];
/// The worker counts of a quick run: in the main process, and in one worker process.
pub const QUICK_DATALOADER_WORKERS: [u32; 2] = [0, 1];
/// The longest one run of a system may take before it is killed.
const RUN_TIMEOUT: Duration = Duration::from_secs(900);
/// The trainer loop, embedded so that the `sluice-bench` binary runs the suite from anywhere.
const TRAINER_SCRIPT: &str = include_str!("../../python/suite_trainer.py");
/// The trainer script's file name in the run's work directory.
const TRAINER_FILE: &str = "suite_trainer.py";

/// The file written beside generated data once the generator succeeded.
const SUCCESS_MARKER: &str = "_SUCCESS";

/// The generated data of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SuiteData {
    /// Rows in the dataset.
    pub rows: u64,
    /// Parquet files it is split into.
    pub files: u64,
    /// Rows per row group.
    pub row_group_rows: usize,
    /// Rows per task of the Sluice job.
    pub task_rows: u64,
}

/// The data of a full run: 20 million rows in 20 files, so that a system's start is a small part of
/// its epoch.
pub const FULL_DATA: SuiteData = SuiteData {
    rows: 20_000_000,
    files: 20,
    row_group_rows: 65_536,
    task_rows: 1 << 18,
};
/// The data of a quick run.
pub const QUICK_DATA: SuiteData = SuiteData {
    rows: 120_000,
    files: 4,
    row_group_rows: 8_192,
    task_rows: 1 << 15,
};

impl SuiteData {
    /// The full run's data with `rows` rows instead of 20 million, in files of a million rows.
    pub fn full_with_rows(rows: u64) -> SuiteData {
        SuiteData {
            rows,
            files: rows.div_ceil(1_000_000),
            ..FULL_DATA
        }
    }

    /// The directory of this data in `cache_dir`; the name carries every parameter of the content.
    pub fn directory_in(&self, cache_dir: &Path) -> PathBuf {
        cache_dir.join(format!(
            "suite-v1-{}rows-{}files-{}rg",
            self.rows, self.files, self.row_group_rows
        ))
    }

    /// The directory of this data converted to MDS for MosaicML Streaming, in batches of
    /// [`BATCH_ROWS`] rows.
    pub fn mds_directory_in(&self, cache_dir: &Path) -> PathBuf {
        let data = self.directory_in(cache_dir);
        let name = data
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        cache_dir.join(format!("{name}-mds-{BATCH_ROWS}rows"))
    }

    /// Returns the data's directory, running `sluice gen` first unless a complete copy is there (one
    /// with the `_SUCCESS` marker written after the generator succeeded).
    fn ensure(&self, sluice: &Path, cache_dir: &Path) -> Result<PathBuf> {
        let directory = self.directory_in(cache_dir);
        let marker = directory.join(SUCCESS_MARKER);
        if marker.exists() {
            return Ok(directory);
        }
        let setup = |operation: String| {
            move |source| BenchError::Setup {
                operation: operation.clone(),
                source,
            }
        };
        if directory.exists() {
            std::fs::remove_dir_all(&directory).map_err(setup(format!(
                "removing the partial data {}",
                directory.display()
            )))?;
        }
        let mut command = Command::new(sluice);
        command
            .arg("gen")
            .arg("--out")
            .arg(&directory)
            .args(["--rows", &self.rows.to_string()])
            .args(["--files", &self.files.to_string()])
            .args(["--row-group-rows", &self.row_group_rows.to_string()]);
        crate::command::run_timed(&mut command, RUN_TIMEOUT)?;
        std::fs::write(&marker, b"").map_err(setup(format!("writing {}", marker.display())))?;
        Ok(directory)
    }
}

/// What `sluice-bench suite` runs.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// The `sluice` executable under test.
    pub sluice: PathBuf,
    /// The Python interpreter with the peers, torch and the `sluice` package; `None` for the suite's
    /// own environment under `cache_dir` (see [`python_env`]).
    pub python: Option<OsString>,
    /// Where the generated data and the suite's Python environment are written once and then reused.
    pub cache_dir: PathBuf,
    /// Small data and one round, for CI.
    pub quick: bool,
    /// Rounds (at least 1); one with `quick`.
    pub rounds: usize,
    /// The user's data instead of the generated data: a Parquet file or directory, or a URI.
    pub source: Option<String>,
    /// Generated data of this many rows instead of [`FULL_DATA`]'s.
    pub rows: Option<u64>,
    /// The systems to run, by name (`sluice` among them); `None` for every one.
    pub systems: Option<Vec<String>>,
    /// The trainer's work per batch in the stall phase, µs; by default the daemon's CPU per batch.
    pub work_us: Option<f64>,
    /// How the ring benchmark starts its producer process.
    pub peer: PeerCommand,
    /// Read the data from an S3 server behind a link of this delay and bandwidth instead of local
    /// files (see [the module's docs](self#remote-data)); `None` for local files.
    pub remote: Option<RemoteOptions>,
}

/// A `DataLoader`-shaped peer: a Dataset or loader run with each of its worker counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Loader {
    /// `DataLoader(batch_size=None)` over a Dataset of one dict of tensors per record batch.
    Batched,
    /// `DataLoader(batch_size=4096)` over a Dataset of one dict per row.
    Naive,
    /// torchdata's `StatefulDataLoader` over the batched Dataset.
    Torchdata,
    /// MosaicML's `StreamingDataset` over MDS through `DataLoader(batch_size=None)`.
    Mosaic,
}

impl Loader {
    /// The worker counts run: 0, 1 and 2 (0 and 1 in a quick run), but the per-row loader, whose
    /// workers only add pickling on two cores, with none.
    fn worker_counts(self, quick: bool) -> &'static [u32] {
        match self {
            Loader::Naive => &[0],
            _ if quick => &QUICK_DATALOADER_WORKERS,
            Loader::Batched | Loader::Torchdata | Loader::Mosaic => &DATALOADER_WORKERS,
        }
    }
}

/// The systems that run as a trainer process (or a job with one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum System {
    Sluice,
    SluiceTorch,
    Loader(Loader, u32),
    Pyarrow,
    Spdl,
    RayData,
}

impl System {
    /// The system's name in the JSON and the trainer script's system argument.
    fn name(self) -> &'static str {
        match self {
            System::Sluice => "sluice",
            System::SluiceTorch => "sluice_torch",
            System::Loader(Loader::Batched, _) => "pytorch_dataloader",
            System::Loader(Loader::Naive, _) => "pytorch_dataloader_naive",
            System::Loader(Loader::Torchdata, _) => "torchdata",
            System::Loader(Loader::Mosaic, _) => "mosaic_streaming",
            System::Pyarrow => "pyarrow",
            System::Spdl => "spdl",
            System::RayData => "ray_data",
        }
    }

    /// The name in the table and in progress lines.
    fn label(self) -> String {
        match self {
            System::Loader(_, workers) => {
                format!("{} ({})", self.name(), workers_label(workers))
            }
            other => other.name().to_owned(),
        }
    }

    fn is_sluice(self) -> bool {
        matches!(self, System::Sluice | System::SluiceTorch)
    }

    fn workers(self) -> Option<u32> {
        match self {
            System::Loader(_, workers) => Some(workers),
            _ => None,
        }
    }

    /// Every system the suite runs, in the order of its table.
    fn all(quick: bool) -> Vec<System> {
        let mut systems = vec![System::Sluice, System::SluiceTorch];
        for loader in [Loader::Batched, Loader::Naive, Loader::Torchdata] {
            systems.extend(
                loader
                    .worker_counts(quick)
                    .iter()
                    .map(|&workers| System::Loader(loader, workers)),
            );
        }
        systems.extend([System::Pyarrow, System::Spdl]);
        systems.extend(
            Loader::Mosaic
                .worker_counts(quick)
                .iter()
                .map(|&workers| System::Loader(Loader::Mosaic, workers)),
        );
        systems.push(System::RayData);
        systems
    }
}

fn workers_label(workers: u32) -> String {
    format!("{workers} worker{}", if workers == 1 { "" } else { "s" })
}

/// One measured entry of the idle phase: a trainer system or one of the two physical limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Trainer(System),
    Ring,
    Memcpy,
}

/// The trainer's work per batch in the work phases, as multiples of the daemon's CPU per batch: the
/// data overhead is given at each.
const WORK_MULTIPLES: [f64; 3] = [1.0, 0.5, 2.0];

/// The JSON line of the trainer script.
#[derive(Debug, Clone, Deserialize)]
struct TrainerLine {
    pid: u32,
    rows: u64,
    batches: u64,
    seconds: f64,
    first_batch_seconds: f64,
    first_batch_rows: u64,
    wait_seconds: f64,
    window_start_ns: u64,
    window_end_ns: u64,
}

/// The JSON line of the trainer script's `facts`.
#[derive(Debug, Clone, Deserialize)]
struct Facts {
    rows: u64,
    arrow_bytes: u64,
    /// The compressed bytes of the columns' chunks in the Parquet files.
    parquet_bytes: u64,
    batches: u64,
    columns: Vec<String>,
    /// The floating-point ones among `columns`.
    float_columns: Vec<String>,
}

/// The JSON line of the trainer script's `mds`.
#[derive(Debug, Clone, Deserialize)]
struct MdsFacts {
    mds_bytes: u64,
}

/// The JSON line of the trainer script's `probe`.
#[derive(Debug, Clone, Deserialize)]
struct Probe {
    /// The version of each distribution that imports.
    versions: BTreeMap<String, String>,
    /// Why each system that cannot run here cannot, by system name.
    missing: BTreeMap<String, String>,
}

/// One run of a trainer system.
#[derive(Debug, Clone)]
struct TrainerRun {
    line: TrainerLine,
    cpu_seconds: f64,
    trainer_cpu_seconds: f64,
    daemon_cpu_seconds: f64,
    peak_rss_bytes: u64,
    peak_pss_bytes: u64,
    /// What crossed the link, in a remote run.
    link: Option<LinkUse>,
}

/// The bytes the link carried to one run of a system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LinkUse {
    /// Over the whole run: the system's start, the trainer's window and its end.
    bytes: u64,
    /// Within the trainer's window.
    window_bytes: u64,
}

impl TrainerRun {
    fn rows_per_s(&self) -> f64 {
        self.line.rows as f64 / self.line.seconds
    }

    /// Rows/s from the first batch on: the rows after it over the time after it.
    fn rows_per_s_steady(&self) -> f64 {
        let after_first = self.line.seconds - self.line.first_batch_seconds;
        (self.line.rows - self.line.first_batch_rows) as f64 / after_first.max(f64::MIN_POSITIVE)
    }

    /// The bytes the link carried in the trainer's window over what it can carry in that time.
    fn link_fraction(&self, bandwidth_bytes_per_s: u64) -> Option<f64> {
        self.link.map(|link| {
            link.window_bytes as f64 / (bandwidth_bytes_per_s as f64 * self.line.seconds)
        })
    }

    fn stall_percent(&self) -> f64 {
        let after_first = self.line.seconds - self.line.first_batch_seconds;
        100.0 * self.line.wait_seconds / after_first.max(f64::MIN_POSITIVE)
    }

    /// The trainer's time from its first request to the end of the data over its compute alone,
    /// `work_us` per batch.
    fn data_overhead(&self, work_us: f64) -> f64 {
        let compute_seconds = self.line.batches as f64 * work_us / 1e6;
        self.line.seconds / compute_seconds.max(f64::MIN_POSITIVE)
    }
}

/// The figures of one system, medians over the rounds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SystemFigures {
    /// Rows per second delivered to an idle trainer, over its whole window (first batch included).
    pub rows_per_s: f64,
    /// Arrow gigabytes (1e9 bytes) per second: rows/s × the data's Arrow bytes per row.
    pub gb_per_s: f64,
    /// Rows per second to an idle trainer after its first batch; `None` for the physical limits.
    pub rows_per_s_steady: Option<f64>,
    /// Seconds from the trainer's first request to its first batch (idle trainer); `None` for the
    /// limits.
    pub first_batch_s: Option<f64>,
    /// CPU seconds of all the system's processes per million rows (idle trainer); `None` for the
    /// physical limits, which have no processes of their own.
    pub cpu_s_per_mrows: Option<f64>,
    /// CPU seconds of the trainer's own process per million rows (idle trainer); `None` for the
    /// limits.
    pub trainer_cpu_s_per_mrows: Option<f64>,
    /// The trainer's epoch time over its pure compute time, with work per batch equal to the
    /// daemon's CPU per batch (1.0 is no overhead); `None` for the limits.
    pub data_overhead: Option<f64>,
    /// The same with half that work per batch.
    pub data_overhead_half_work: Option<f64>,
    /// The same with twice that work per batch.
    pub data_overhead_double_work: Option<f64>,
    /// Percent of the trainer's time spent waiting for a batch after the first, with work per batch
    /// equal to the daemon's CPU per batch; `None` for the limits.
    pub stall_percent: Option<f64>,
    /// The sum of the peak RSS of the system's processes (idle trainer, memory run), shared pages counted in
    /// every process that maps them; `None` for the limits.
    pub peak_rss_bytes: Option<u64>,
    /// The peak of the sum of the proportional set sizes of the system's processes (idle trainer,
    /// memory run), shared pages counted once; `None` for the limits.
    pub peak_pss_bytes: Option<u64>,
    /// The rows the trainer received in every run; `None` for the limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
    /// The loader's worker count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_workers: Option<u32>,
    /// Rows/s over sluice's rows/s.
    pub ratio_to_sluice: f64,
    /// In a remote run, the bytes the link carried to the system over its whole run (its start, the
    /// trainer's window and its end); `None` for the limits and in a local run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_bytes: Option<u64>,
    /// In a remote run, the bytes the link carried to the system within the trainer's window over
    /// the link's bandwidth × the window; `None` for the limits and in a local run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_fraction: Option<f64>,
}

/// One target of the suite, recorded against the figures (not asserted).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Target {
    /// What is compared.
    pub figure: String,
    /// The peer compared with, the best one at this figure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_peer: Option<String>,
    /// The measured value.
    pub measured: f64,
    /// The bound.
    pub bound: f64,
    /// Whether the bound is a most (`measured ≤ bound`) rather than a least.
    pub at_most: bool,
    /// Whether the measured value is within the bound.
    pub met: bool,
}

impl Target {
    fn new(
        figure: &str,
        best_peer: Option<&str>,
        measured: f64,
        bound: f64,
        at_most: bool,
    ) -> Target {
        Target {
            figure: figure.to_owned(),
            best_peer: best_peer.map(str::to_owned),
            measured,
            bound,
            at_most,
            met: if at_most {
                measured <= bound
            } else {
                measured >= bound
            },
        }
    }
}

/// Everything one `sluice-bench suite` run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SuiteReport {
    /// The data every system read.
    pub source: String,
    /// Rows in the data.
    pub rows: u64,
    /// The columns every system delivered as tensors: the data's integer and floating-point ones.
    pub columns: Vec<String>,
    /// Their size as Arrow IPC record batches of `batch_rows` rows.
    pub arrow_bytes: u64,
    /// Rows per batch for every system.
    pub batch_rows: usize,
    /// The ring's and memcpy's record size: the mean Arrow IPC bytes of one batch.
    pub record_bytes: usize,
    /// The trainer's work per batch of the `data_overhead` and `stall_percent` figures, µs; the other
    /// work phases run half and twice this. `None` in a remote run, which has no work phases.
    pub work_us: Option<f64>,
    /// Whether `work_us` was given (`--work-us`) or measured (the daemon's CPU per batch).
    pub work_us_given: bool,
    /// Rounds of each phase.
    pub rounds: usize,
    /// The Python interpreter of the trainers.
    pub python: String,
    /// The version of each Python distribution the systems use.
    pub versions: BTreeMap<String, String>,
    /// The 1-minute load average when the run started.
    pub load_average_start: Option<f64>,
    /// The 1-minute load average when the run ended.
    pub load_average_end: Option<f64>,
    /// The figures by system name; a loader's are those of its worker count with the lowest data
    /// overhead.
    pub systems: BTreeMap<String, SystemFigures>,
    /// Every worker count of each loader that was run, in order, by system name.
    pub by_workers: BTreeMap<String, Vec<SystemFigures>>,
    /// Systems that cannot run here, so were not measured, with the reason.
    pub not_installed: BTreeMap<String, String>,
    /// Systems left out by `--systems`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
    /// The targets, Sluice (`sluice`) against the best peer at each figure.
    pub targets: Vec<Target>,
    /// The S3 server and the link of a remote run; `None` in a local run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteReport>,
}

/// What the systems of a remote run read through the link.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RemoteReport {
    /// The data's URI on the S3 server.
    pub uri: String,
    /// The MosaicML Streaming copy's URI, when MosaicML Streaming ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mds_uri: Option<String>,
    /// The link's delay before the first byte of every response, ms.
    pub delay_ms: f64,
    /// The link's bandwidth, bytes per second, in each direction.
    pub bandwidth_bytes_per_s: u64,
    /// The bytes of the Parquet files uploaded.
    pub file_bytes: u64,
    /// The compressed bytes of the delivered columns' chunks: the least a Parquet reader fetches.
    pub parquet_bytes: u64,
    /// The bytes of the MDS files uploaded, when MosaicML Streaming ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mds_bytes: Option<u64>,
}

/// The systems that are not Sluice.
const PEERS: [&str; 7] = [
    "pytorch_dataloader",
    "pytorch_dataloader_naive",
    "torchdata",
    "pyarrow",
    "spdl",
    "mosaic_streaming",
    "ray_data",
];

/// Refuses a `--systems` list that names a system the suite does not have, or leaves out Sluice,
/// which every target compares against.
fn check_systems(names: &[String]) -> Result<()> {
    let mut known: Vec<&str> = System::all(false).into_iter().map(System::name).collect();
    known.dedup();
    let reason = if let Some(unknown) = names.iter().find(|name| !known.contains(&name.as_str())) {
        format!("names `{unknown}`, which the suite does not run")
    } else if !names.iter().any(|name| name == "sluice") {
        "leaves out `sluice`, against which every target is measured".to_owned()
    } else {
        return Ok(());
    };
    Err(BenchError::InvalidOption {
        option: "--systems".to_owned(),
        reason: format!("{reason}; name systems from {}", known.join(", ")),
    })
}

/// Runs the suite; `progress` receives one line per finished run.
///
/// # Errors
///
/// Returns an error when a program is missing (pyarrow, torch, the `sluice` package), the Python
/// environment cannot be prepared, the data cannot be generated, a system fails or delivers another
/// number of rows than the data holds.
pub fn run_suite_bench(
    options: &SuiteOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<SuiteReport> {
    if options.rounds == 0 {
        return Err(BenchError::InvalidOption {
            option: "--rounds".to_owned(),
            reason: "0 rounds measure nothing; give at least 1".to_owned(),
        });
    }
    if let Some(work_us) = options.work_us
        && !(work_us.is_finite() && work_us > 0.0)
    {
        return Err(BenchError::InvalidOption {
            option: "--work-us".to_owned(),
            reason: format!(
                "{work_us} is not a positive duration; give microseconds, e.g. --work-us 500"
            ),
        });
    }
    if let Some(names) = &options.systems {
        check_systems(names)?;
    }
    if options.rows == Some(0) {
        return Err(BenchError::InvalidOption {
            option: "--rows".to_owned(),
            reason: "0 rows measure nothing; give at least one batch, e.g. --rows 80000000"
                .to_owned(),
        });
    }
    let python = match &options.python {
        Some(python) => python.clone(),
        None => python_env::prepare(&options.cache_dir, progress)?.into_os_string(),
    };
    check_pyarrow(&python)?;
    check_trainer_modules(&python)?;
    let load_average_start = load_average();
    let rounds = if options.quick { 1 } else { options.rounds };
    let data = match options.rows {
        _ if options.quick => QUICK_DATA,
        Some(rows) => SuiteData::full_with_rows(rows),
        None => FULL_DATA,
    };
    let work = tempfile::tempdir().map_err(|source| BenchError::Setup {
        operation: "creating a directory for the suite's job, rings and scripts".to_owned(),
        source,
    })?;
    let script = work.path().join(TRAINER_FILE);
    std::fs::write(&script, TRAINER_SCRIPT).map_err(|source| BenchError::Setup {
        operation: format!("writing {}", script.display()),
        source,
    })?;
    let (local_source, mds) = match &options.source {
        Some(source) => (DataSource::given(source)?, work.path().join("mds")),
        None => {
            let directory = data.directory_in(&options.cache_dir);
            if !directory.join(SUCCESS_MARKER).exists() {
                progress(&format!(
                    "generating {} rows in {}",
                    data.rows,
                    directory.display()
                ));
            }
            let source = DataSource::local(&data.ensure(&options.sluice, &options.cache_dir)?);
            (source, data.mds_directory_in(&options.cache_dir))
        }
    };
    progress(&format!("data: {}", local_source.python));
    let mut runner = Runner {
        sluice: &options.sluice,
        python: &python,
        script: &script,
        work: work.path(),
        source: local_source.clone(),
        task_rows: data.task_rows,
        columns: Vec::new(),
        float_columns: Vec::new(),
        mds: &mds,
        remote: None,
    };
    // The facts pass reads every row once, which also warms the page cache for every system.
    let facts: Facts = runner.python_json(&["facts"])?;
    if facts.rows == 0 || facts.batches == 0 || facts.columns.is_empty() {
        return Err(BenchError::InvalidOption {
            option: "--source".to_owned(),
            reason: format!(
                "{} holds no rows of integer or floating-point columns; give a dataset with some",
                local_source.python
            ),
        });
    }
    runner.columns.clone_from(&facts.columns);
    runner.float_columns.clone_from(&facts.float_columns);
    let probe: Probe = runner.python_json(&["probe"])?;
    let bytes_per_row = facts.arrow_bytes as f64 / facts.rows as f64;
    let record_bytes = usize::try_from(facts.arrow_bytes.div_ceil(facts.batches))
        .unwrap_or(usize::MAX)
        .max(crate::workload::MIN_RECORD_SIZE);
    let rows_per_record = facts.rows as f64 / facts.batches as f64;
    progress(&format!(
        "{} rows, columns {}, {:.1} MB as Arrow ({bytes_per_row:.1} B/row), {record_bytes} B per batch",
        facts.rows,
        facts.columns.join(","),
        facts.arrow_bytes as f64 / 1e6
    ));
    for (system, reason) in &probe.missing {
        progress(&format!("{system}: not installed: {reason}"));
    }

    let chosen = |system: &System| {
        options
            .systems
            .as_ref()
            .is_none_or(|names| names.iter().any(|name| name == system.name()))
    };
    let mut left_out: Vec<String> = System::all(options.quick)
        .into_iter()
        .filter(|system| !chosen(system))
        .map(|system| system.name().to_owned())
        .collect();
    left_out.dedup();
    if !left_out.is_empty() {
        progress(&format!("left out by --systems: {}", left_out.join(", ")));
    }
    let systems: Vec<System> = System::all(options.quick)
        .into_iter()
        .filter(|system| chosen(system) && !probe.missing.contains_key(system.name()))
        .collect();
    let mosaic_runs = systems
        .iter()
        .any(|system| matches!(system, System::Loader(Loader::Mosaic, _)));
    let store = options.remote.map(RemoteStore::start).transpose()?;
    let remote_report = match &store {
        Some(store) => {
            let report = upload(
                store,
                &runner,
                &local_source,
                mosaic_runs.then_some(&mds),
                facts.parquet_bytes,
                progress,
            )?;
            runner.source = DataSource::remote(&report.uri);
            runner.remote = Some(RemoteRun {
                store,
                mds_uri: report.mds_uri.clone(),
            });
            Some(report)
        }
        None => None,
    };
    let mut entries: Vec<Entry> = systems.iter().copied().map(Entry::Trainer).collect();
    let ring_options = RingBenchOptions {
        sizes: vec![record_bytes],
        quick: options.quick,
        peer: options.peer.clone(),
    };
    // The limits of a local run are the ring and memcpy; a remote run's is the link.
    let mut transports = match &store {
        Some(_) => None,
        None => {
            entries.extend([Entry::Ring, Entry::Memcpy]);
            Some(TransportBench::new(&ring_options)?)
        }
    };
    let mut idle: BTreeMap<System, Vec<TrainerRun>> = BTreeMap::new();
    // The runs each system's peak memory is read from (see `Sampling`).
    let mut memory_runs: BTreeMap<System, Vec<TrainerRun>> = BTreeMap::new();
    let mut ring_rows_per_s = Vec::new();
    let mut memcpy_rows_per_s = Vec::new();
    for round in 0..rounds {
        for offset in 0..entries.len() {
            let entry = entries[(round + offset) % entries.len()];
            let label = format!("idle trainer, round {}", round + 1);
            match (entry, transports.as_mut()) {
                (Entry::Trainer(system), _) => {
                    // A remote run is bound by the link, not by the CPU the walks of the page
                    // tables take: it samples its memory as it goes. A local one is run again for it.
                    let sampling = if store.is_some() {
                        Sampling::Memory
                    } else {
                        Sampling::Timed
                    };
                    let run = runner.run(system, 0.0, facts.rows, sampling)?;
                    let link = run.link.map_or_else(String::new, |link| {
                        format!(
                            ", {:.1} MB through the link ({:.1} in the window)",
                            link.bytes as f64 / 1e6,
                            link.window_bytes as f64 / 1e6
                        )
                    });
                    progress(&format!(
                        "{label}: {}: {:.3} M rows/s ({:.3} after the first batch at {:.2} s), {:.2} CPU s ({:.2} in the trainer){link}",
                        system.label(),
                        run.rows_per_s() / 1e6,
                        run.rows_per_s_steady() / 1e6,
                        run.line.first_batch_seconds,
                        run.cpu_seconds,
                        run.trainer_cpu_seconds,
                    ));
                    let memory = match sampling {
                        Sampling::Memory => run.clone(),
                        Sampling::Timed => {
                            let memory = runner.run(system, 0.0, facts.rows, Sampling::Memory)?;
                            progress(&format!(
                                "{label}: {}: peak PSS {:.0} MB, in a run of its own",
                                system.label(),
                                memory.peak_pss_bytes as f64 / 1e6
                            ));
                            memory
                        }
                    };
                    idle.entry(system).or_default().push(run);
                    memory_runs.entry(system).or_default().push(memory);
                }
                (Entry::Ring, Some(transports)) => {
                    let measurement = transports.measure(Transport::SluiceRing, record_bytes)?;
                    let rows_per_s = measurement.msgs_per_s() * rows_per_record;
                    progress(&format!(
                        "{label}: ring: {:.0} records/s of {record_bytes} B, {:.3} M rows/s",
                        measurement.msgs_per_s(),
                        rows_per_s / 1e6
                    ));
                    ring_rows_per_s.push(rows_per_s);
                }
                (Entry::Memcpy, Some(transports)) => {
                    let gbps = transports.measure_memcpy()?;
                    let rows_per_s = gbps * 1e9 / bytes_per_row;
                    progress(&format!(
                        "{label}: memcpy: {gbps:.2} GB/s, {:.3} M rows/s",
                        rows_per_s / 1e6
                    ));
                    memcpy_rows_per_s.push(rows_per_s);
                }
                // Only a local run lists the ring and memcpy, and it has their transports.
                (Entry::Ring | Entry::Memcpy, None) => {}
            }
        }
    }

    // A remote run measures the link: it has no work phases.
    let work = match (&store, options.work_us) {
        (Some(_), _) => None,
        (None, Some(work_us)) => Some((work_us, true)),
        (None, None) => Some((
            daemon_us_per_batch(idle.get(&System::Sluice).map_or(&[][..], Vec::as_slice))?,
            false,
        )),
    };
    let mut working: BTreeMap<(System, usize), Vec<TrainerRun>> = BTreeMap::new();
    if let Some((work_us, _)) = work {
        progress(&format!(
            "work phases: {} µs of work per batch",
            WORK_MULTIPLES
                .map(|multiple| format!("{:.1}", multiple * work_us))
                .join(", ")
        ));
        for round in 0..rounds {
            for (phase, multiple) in WORK_MULTIPLES.iter().enumerate() {
                for offset in 0..systems.len() {
                    let system = systems[(round + offset) % systems.len()];
                    let phase_work_us = multiple * work_us;
                    let run = runner.run(system, phase_work_us, facts.rows, Sampling::Timed)?;
                    progress(&format!(
                        "work {phase_work_us:.0} µs per batch, round {}: {}: data overhead {:.3}, stall {:.2} %",
                        round + 1,
                        system.label(),
                        run.data_overhead(phase_work_us),
                        run.stall_percent()
                    ));
                    working.entry((system, phase)).or_default().push(run);
                }
            }
        }
    }

    let bandwidth = remote_report
        .as_ref()
        .map(|report| report.bandwidth_bytes_per_s);
    let figures_of = |system: System| -> Result<SystemFigures> {
        let median =
            |runs: Option<&Vec<TrainerRun>>, figure: &dyn Fn(&TrainerRun) -> f64, what: &str| {
                Spread::measured(
                    runs.map(|runs| runs.iter().map(figure).collect())
                        .unwrap_or_default(),
                    || format!("{what} of {}", system.label()),
                )
                .map(|spread| spread.median)
            };
        let fast = idle.get(&system);
        let memory = memory_runs.get(&system);
        let overhead = |phase: usize| {
            work.map(|(work_us, _)| {
                let phase_work_us = WORK_MULTIPLES[phase] * work_us;
                median(
                    working.get(&(system, phase)),
                    &|run| run.data_overhead(phase_work_us),
                    "data overhead",
                )
            })
            .transpose()
        };
        let per_mrows = |seconds: f64, run: &TrainerRun| seconds / run.line.rows as f64 * 1e6;
        let rows_per_s = median(fast, &TrainerRun::rows_per_s, "rows/s")?;
        Ok(SystemFigures {
            rows_per_s,
            gb_per_s: rows_per_s * bytes_per_row / 1e9,
            rows_per_s_steady: Some(median(
                fast,
                &TrainerRun::rows_per_s_steady,
                "rows/s after the first batch",
            )?),
            first_batch_s: Some(median(
                fast,
                &|run| run.line.first_batch_seconds,
                "seconds to the first batch",
            )?),
            cpu_s_per_mrows: Some(median(
                fast,
                &|run| per_mrows(run.cpu_seconds, run),
                "CPU seconds per million rows",
            )?),
            trainer_cpu_s_per_mrows: Some(median(
                fast,
                &|run| per_mrows(run.trainer_cpu_seconds, run),
                "the trainer's CPU seconds per million rows",
            )?),
            data_overhead: overhead(0)?,
            data_overhead_half_work: overhead(1)?,
            data_overhead_double_work: overhead(2)?,
            stall_percent: work
                .map(|_| {
                    median(
                        working.get(&(system, 0)),
                        &TrainerRun::stall_percent,
                        "stall %",
                    )
                })
                .transpose()?,
            peak_rss_bytes: Some(
                median(memory, &|run| run.peak_rss_bytes as f64, "peak RSS")? as u64,
            ),
            peak_pss_bytes: Some(
                median(memory, &|run| run.peak_pss_bytes as f64, "peak PSS")? as u64,
            ),
            rows: Some(facts.rows),
            num_workers: system.workers(),
            ratio_to_sluice: 0.0,
            link_bytes: bandwidth
                .map(|_| {
                    median(
                        fast,
                        &|run| run.link.map_or(f64::NAN, |link| link.bytes as f64),
                        "bytes through the link",
                    )
                })
                .transpose()?
                .map(|bytes| bytes as u64),
            link_fraction: bandwidth
                .map(|bandwidth| {
                    median(
                        fast,
                        &|run| run.link_fraction(bandwidth).unwrap_or(f64::NAN),
                        "the link fraction",
                    )
                })
                .transpose()?,
        })
    };
    let limit = |samples: Vec<f64>, what: &str| -> Result<SystemFigures> {
        let rows_per_s = Spread::measured(samples, || format!("rows/s of {what}"))?.median;
        Ok(SystemFigures {
            rows_per_s,
            gb_per_s: rows_per_s * bytes_per_row / 1e9,
            rows_per_s_steady: None,
            first_batch_s: None,
            cpu_s_per_mrows: None,
            trainer_cpu_s_per_mrows: None,
            data_overhead: None,
            data_overhead_half_work: None,
            data_overhead_double_work: None,
            stall_percent: None,
            peak_rss_bytes: None,
            peak_pss_bytes: None,
            rows: None,
            num_workers: None,
            ratio_to_sluice: 0.0,
            link_bytes: None,
            link_fraction: None,
        })
    };
    let mut by_name: BTreeMap<String, SystemFigures> = BTreeMap::new();
    let mut by_workers: BTreeMap<String, Vec<SystemFigures>> = BTreeMap::new();
    for &system in &systems {
        let figures = figures_of(system)?;
        match system {
            System::Loader(..) => by_workers
                .entry(system.name().to_owned())
                .or_default()
                .push(figures),
            other => {
                by_name.insert(other.name().to_owned(), figures);
            }
        }
    }
    for (name, counts) in &by_workers {
        // The worker count of a loader's figure: the lowest data overhead, or in a remote run,
        // which has no work phases, the most rows/s.
        let best = counts
            .iter()
            .min_by(|left, right| {
                let cost = |figures: &SystemFigures| {
                    figures.data_overhead.unwrap_or(1.0 / figures.rows_per_s)
                };
                cost(left).total_cmp(&cost(right))
            })
            .cloned()
            .ok_or_else(|| BenchError::Disagree {
                what: name.clone(),
                detail: "no worker count was measured".to_owned(),
            })?;
        by_name.insert(name.clone(), best);
    }
    match &remote_report {
        Some(report) => {
            let parquet_bytes_per_row = report.parquet_bytes as f64 / facts.rows as f64;
            by_name.insert(
                "link".to_owned(),
                limit(
                    vec![report.bandwidth_bytes_per_s as f64 / parquet_bytes_per_row],
                    "the link",
                )?,
            );
        }
        None => {
            by_name.insert("ring".to_owned(), limit(ring_rows_per_s, "the ring")?);
            by_name.insert("memcpy".to_owned(), limit(memcpy_rows_per_s, "memcpy")?);
        }
    }
    let sluice = by_name
        .get("sluice")
        .cloned()
        .ok_or_else(|| BenchError::Disagree {
            what: "sluice".to_owned(),
            detail: "not measured".to_owned(),
        })?;
    for figures in by_name
        .values_mut()
        .chain(by_workers.values_mut().flatten())
    {
        figures.ratio_to_sluice = figures.rows_per_s / sluice.rows_per_s;
    }
    let targets = match &remote_report {
        Some(_) => remote_targets(&sluice, &by_name),
        None => targets(&sluice, &by_name),
    };
    Ok(SuiteReport {
        source: runner.source.python.clone(),
        rows: facts.rows,
        columns: facts.columns,
        arrow_bytes: facts.arrow_bytes,
        batch_rows: BATCH_ROWS,
        record_bytes,
        work_us: work.map(|(work_us, _)| work_us),
        work_us_given: work.is_some_and(|(_, given)| given),
        rounds,
        python: python.to_string_lossy().into_owned(),
        versions: probe.versions,
        load_average_start,
        load_average_end: load_average(),
        systems: by_name,
        by_workers,
        not_installed: probe.missing,
        left_out,
        targets,
        remote: remote_report,
    })
}

/// Uploads the local data (and, for MosaicML Streaming, its MDS copy in `mds`, converted first) to
/// the remote store, past the link.
fn upload(
    store: &RemoteStore,
    runner: &Runner<'_>,
    local_source: &DataSource,
    mds: Option<&PathBuf>,
    parquet_bytes: u64,
    progress: &mut dyn FnMut(&str),
) -> Result<RemoteReport> {
    let local = local_source.local.as_deref().ok_or_else(|| BenchError::InvalidOption {
        option: "--source".to_owned(),
        reason: format!(
            "{} is a URI, and --remote reads the suite's own S3 server, to which it uploads the data; \
             give a local Parquet file or directory",
            local_source.python
        ),
    })?;
    let name = |path: &Path| {
        path.file_name().map_or_else(
            || "data".to_owned(),
            |name| name.to_string_lossy().into_owned(),
        )
    };
    let prefix = format!("suite/{}", name(local));
    let file_bytes = store.upload(local, &prefix)?;
    let uri = store.uri(&prefix);
    progress(&format!(
        "uploaded {:.1} MB of Parquet to {uri}",
        file_bytes as f64 / 1e6
    ));
    let mds_upload = match mds {
        Some(mds) => {
            let mds_text = mds.display().to_string();
            let converted: MdsFacts = runner.python_json(&[
                "mds",
                "--scratch",
                &mds_text,
                "--columns",
                &runner.columns.join(","),
            ])?;
            let mds_prefix = format!("suite/{}", name(mds));
            store.upload(mds, &mds_prefix)?;
            let mds_uri = store.uri(&mds_prefix);
            progress(&format!(
                "uploaded {:.1} MB of MDS to {mds_uri}",
                converted.mds_bytes as f64 / 1e6
            ));
            Some((mds_uri, converted.mds_bytes))
        }
        None => None,
    };
    let options = store.options();
    Ok(RemoteReport {
        uri,
        mds_uri: mds_upload.as_ref().map(|(uri, _)| uri.clone()),
        delay_ms: options.delay.as_secs_f64() * 1e3,
        bandwidth_bytes_per_s: options.bandwidth_bytes_per_s.get(),
        file_bytes,
        parquet_bytes,
        mds_bytes: mds_upload.map(|(_, bytes)| bytes),
    })
}

/// Sluice against the best peer at each figure of the targets.
fn targets(sluice: &SystemFigures, systems: &BTreeMap<String, SystemFigures>) -> Vec<Target> {
    // The peer with the lowest (or, with `highest`, the highest) value of a figure, and that value.
    let best = |figure: fn(&SystemFigures) -> Option<f64>, highest: bool| {
        PEERS
            .iter()
            .filter_map(|name| Some((*name, figure(systems.get(*name)?)?)))
            .min_by(|left, right| {
                if highest {
                    right.1.total_cmp(&left.1)
                } else {
                    left.1.total_cmp(&right.1)
                }
            })
    };
    let sluice_value =
        |figure: fn(&SystemFigures) -> Option<f64>| figure(sluice).unwrap_or(f64::NAN);
    let mut targets = vec![Target::new(
        "sluice data overhead at work = the daemon's CPU per batch",
        None,
        sluice_value(|figures| figures.data_overhead),
        Targets::DATA_OVERHEAD,
        true,
    )];
    // (figure, its value, whether more is better, the bound, whether the bound is a most, whether
    // the ratio is the peer's over Sluice's rather than Sluice's over the peer's)
    type Comparison = (
        &'static str,
        fn(&SystemFigures) -> Option<f64>,
        bool,
        f64,
        bool,
        bool,
    );
    let comparisons: [Comparison; 4] = [
        (
            "the best peer's epoch ÷ sluice's, at work = the daemon's CPU per batch",
            |figures| figures.data_overhead,
            false,
            Targets::EPOCH,
            false,
            true,
        ),
        (
            "sluice's steady rows/s ÷ the best peer's",
            |figures| figures.rows_per_s_steady,
            true,
            Targets::STEADY,
            false,
            false,
        ),
        (
            "sluice's CPU per row ÷ the best peer's, all processes",
            |figures| figures.cpu_s_per_mrows,
            false,
            Targets::CPU,
            true,
            false,
        ),
        (
            "sluice's CPU per row ÷ the best peer's, the trainer's process",
            |figures| figures.trainer_cpu_s_per_mrows,
            false,
            Targets::TRAINER_CPU,
            true,
            false,
        ),
    ];
    for (figure_name, figure, highest, bound, at_most, peer_over_sluice) in comparisons {
        if let Some((peer, peer_value)) = best(figure, highest) {
            let sluice_figure = sluice_value(figure);
            let measured = if peer_over_sluice {
                peer_value / sluice_figure
            } else {
                sluice_figure / peer_value
            };
            targets.push(Target::new(
                figure_name,
                Some(peer),
                measured,
                bound,
                at_most,
            ));
        }
    }
    targets
}

/// Sluice against the best peer through the link of a remote run: rows/s, and Sluice's share of the
/// link.
fn remote_targets(
    sluice: &SystemFigures,
    systems: &BTreeMap<String, SystemFigures>,
) -> Vec<Target> {
    let mut targets = Vec::new();
    let best = PEERS
        .iter()
        .filter_map(|name| Some((*name, systems.get(*name)?.rows_per_s)))
        .max_by(|left, right| left.1.total_cmp(&right.1));
    if let Some((peer, peer_rows_per_s)) = best {
        targets.push(Target::new(
            "sluice's rows/s ÷ the best peer's, through the link",
            Some(peer),
            sluice.rows_per_s / peer_rows_per_s,
            Targets::REMOTE_ROWS,
            false,
        ));
    }
    targets.push(Target::new(
        "sluice's share of the link's bandwidth in its window",
        None,
        sluice.link_fraction.unwrap_or(f64::NAN),
        Targets::REMOTE_LINK,
        false,
    ));
    targets
}

/// The bounds of the suite's targets.
struct Targets;

impl Targets {
    const DATA_OVERHEAD: f64 = 1.05;
    const EPOCH: f64 = 1.5;
    const STEADY: f64 = 1.2;
    const CPU: f64 = 0.5;
    const TRAINER_CPU: f64 = 0.2;
    const REMOTE_ROWS: f64 = 3.0;
    const REMOTE_LINK: f64 = 0.8;
}

/// The daemon's CPU microseconds per batch, median over the runs of the `sluice` system.
fn daemon_us_per_batch(runs: &[TrainerRun]) -> Result<f64> {
    let per_batch = runs
        .iter()
        .map(|run| run.daemon_cpu_seconds / run.line.batches.max(1) as f64 * 1e6)
        .collect();
    let median = Spread::measured(per_batch, || {
        "the daemon's CPU time per batch, which sets the work phase's --work-us".to_owned()
    })?
    .median;
    if median > 0.0 {
        Ok(median)
    } else {
        Err(BenchError::Disagree {
            what: "the daemon's CPU time per batch".to_owned(),
            detail: "no `sluice daemon` process used CPU in the trainer's window; give --work-us"
                .to_owned(),
        })
    }
}

/// Fails with the fix unless the interpreter can import torch and the `sluice` package.
fn check_trainer_modules(python: &OsString) -> Result<()> {
    for (module, fix) in [
        (
            "torch",
            "pip install torch (the CPU wheel is enough); the DataLoader and sluice.torch rows need it",
        ),
        (
            "sluice",
            "install the Python client: python3 -m pip install --no-build-isolation ./dataplane/python",
        ),
    ] {
        let output = Command::new(python)
            .args(["-c", &format!("import {module}")])
            .output();
        let reason = match output {
            Ok(output) if output.status.success() => continue,
            Ok(output) => String::from_utf8_lossy(&output.stderr)
                .trim()
                .lines()
                .last()
                .unwrap_or_default()
                .to_owned(),
            Err(error) => error.to_string(),
        };
        return Err(BenchError::ToolMissing {
            program: format!("{} with {module}", python.to_string_lossy()),
            purpose: "the trainers of `sluice bench suite`".to_owned(),
            reason,
            fix: fix.to_owned(),
        });
    }
    Ok(())
}

/// The dataset as the Sluice job names it and as pyarrow opens it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DataSource {
    sluice_uri: String,
    python: String,
    /// The file or directory, when the dataset is local.
    local: Option<PathBuf>,
}

impl DataSource {
    fn local(path: &Path) -> DataSource {
        DataSource {
            sluice_uri: format!("file://{}", path.display()),
            python: path.display().to_string(),
            local: Some(path.to_owned()),
        }
    }

    /// A dataset at a URI, which every system reads as it is.
    fn remote(uri: &str) -> DataSource {
        DataSource {
            sluice_uri: uri.to_owned(),
            python: uri.to_owned(),
            local: None,
        }
    }

    /// The user's `--source`: a URI as it is, a path made absolute.
    fn given(source: &str) -> Result<DataSource> {
        if source.contains("://") {
            return Ok(DataSource::remote(source));
        }
        let path = std::path::absolute(source).map_err(|source_error| BenchError::Setup {
            operation: format!("--source {source}: making the path absolute"),
            source: source_error,
        })?;
        if !path.exists() {
            return Err(BenchError::InvalidOption {
                option: "--source".to_owned(),
                reason: format!(
                    "{} does not exist; give a Parquet file, a directory of Parquet files, or a URI such as s3://bucket/prefix",
                    path.display()
                ),
            });
        }
        Ok(DataSource::local(&path))
    }
}

/// Runs the systems of one suite.
struct Runner<'a> {
    sluice: &'a Path,
    python: &'a OsString,
    script: &'a Path,
    work: &'a Path,
    source: DataSource,
    task_rows: u64,
    /// The columns every system delivers, once `facts` has listed them.
    columns: Vec<String>,
    /// The floating-point ones among `columns`.
    float_columns: Vec<String>,
    /// Where MosaicML Streaming's MDS copy of the data is kept.
    mds: &'a Path,
    /// The remote store the systems read through, once the data is uploaded to it.
    remote: Option<RemoteRun<'a>>,
}

/// The remote store of a remote run and the data on it.
struct RemoteRun<'a> {
    store: &'a RemoteStore,
    /// The MDS copy's URI, when MosaicML Streaming runs.
    mds_uri: Option<String>,
}

impl Runner<'_> {
    /// The trainer script's command for `system` with `work_us` of work per batch; `mosaic_cache` is
    /// MosaicML Streaming's local cache of a remote MDS copy.
    fn trainer_arguments(
        &self,
        system: System,
        work_us: f64,
        mosaic_cache: Option<&Path>,
    ) -> Vec<String> {
        let mut arguments = vec![
            self.script.display().to_string(),
            system.name().to_owned(),
            "--source".to_owned(),
            self.source.python.clone(),
            "--batch-rows".to_owned(),
            BATCH_ROWS.to_string(),
            "--work-us".to_owned(),
            format!("{work_us:.3}"),
            "--columns".to_owned(),
            self.columns.join(","),
        ];
        if let Some(workers) = system.workers() {
            arguments.extend(["--workers".to_owned(), workers.to_string()]);
        }
        if let System::Loader(Loader::Mosaic, _) = system {
            match (
                self.remote
                    .as_ref()
                    .and_then(|remote| remote.mds_uri.as_ref()),
                mosaic_cache,
            ) {
                (Some(mds_uri), Some(cache)) => arguments.extend([
                    "--mds-remote".to_owned(),
                    mds_uri.clone(),
                    "--scratch".to_owned(),
                    cache.display().to_string(),
                ]),
                _ => arguments.extend(["--scratch".to_owned(), self.mds.display().to_string()]),
            }
        }
        arguments
    }

    /// The Python interpreter, told not to send Ray's usage statistics anywhere, and in a remote run
    /// where the S3 server is and how to sign for it.
    fn python_command(&self) -> Command {
        let mut command = Command::new(self.python);
        command.env("RAY_USAGE_STATS_ENABLED", "0");
        if let Some(remote) = &self.remote {
            command.envs(remote.store.python_environment());
        }
        command
    }

    /// Runs the trainer script with `arguments` and parses its JSON line.
    fn python_json<T: for<'de> Deserialize<'de>>(&self, arguments: &[&str]) -> Result<T> {
        let mut command = self.python_command();
        command
            .arg(self.script)
            .args(arguments)
            .args(["--source", &self.source.python])
            .args(["--batch-rows", &BATCH_ROWS.to_string()]);
        let run = crate::command::run_timed(&mut command, RUN_TIMEOUT)?;
        last_json_line(&run.stdout).map_err(|reason| BenchError::CommandOutput {
            command: display(&command),
            stdout: run.stdout.clone(),
            reason,
        })
    }

    /// Runs `system` once and checks that its trainer received every row.
    ///
    /// The CPU time counted is that of the trainer's window; the peak RSS is each process's whole life.
    fn run(
        &self,
        system: System,
        work_us: f64,
        rows: u64,
        sampling: Sampling,
    ) -> Result<TrainerRun> {
        // MosaicML Streaming's local cache of a remote copy starts empty in every run.
        let mosaic_cache = match (&self.remote, system) {
            (Some(_), System::Loader(Loader::Mosaic, _)) => Some(
                tempfile::Builder::new()
                    .prefix("mosaic-cache-")
                    .tempdir_in(self.work)
                    .map_err(|source| BenchError::Setup {
                        operation: format!(
                            "creating MosaicML Streaming's cache in {}",
                            self.work.display()
                        ),
                        source,
                    })?,
            ),
            _ => None,
        };
        let mosaic_cache = mosaic_cache.as_ref().map(tempfile::TempDir::path);
        let meter = self.remote.as_ref().map(|remote| remote.store.meter());
        let ran = if system.is_sluice() {
            self.run_sluice(system, work_us, sampling)
        } else {
            self.run_python(system, work_us, mosaic_cache, sampling)
        };
        let link_samples = meter.map(remote::LinkMeter::finish);
        let (command_line, line, samples) = ran?;
        if line.rows != rows {
            return Err(BenchError::Disagree {
                what: format!("rows of {} ({})", self.source.python, system.label()),
                detail: format!("{} rows delivered, the data has {rows}", line.rows),
            });
        }
        if !(line.seconds.is_finite() && line.seconds > 0.0) {
            return Err(BenchError::CommandOutput {
                command: command_line,
                stdout: format!("{line:?}"),
                reason: "the trainer's window is not a duration".to_owned(),
            });
        }
        let cpu_seconds =
            samples.cpu_seconds_between(line.window_start_ns, line.window_end_ns, |_| true);
        let trainer_cpu_seconds =
            samples.cpu_seconds_between(line.window_start_ns, line.window_end_ns, |process| {
                process.pid == line.pid
            });
        let daemon_cpu_seconds =
            samples.cpu_seconds_between(line.window_start_ns, line.window_end_ns, is_sluice_daemon);
        let link = link_samples.map(|link| LinkUse {
            bytes: link.bytes(),
            window_bytes: link.bytes_between(line.window_start_ns, line.window_end_ns),
        });
        Ok(TrainerRun {
            cpu_seconds,
            trainer_cpu_seconds,
            daemon_cpu_seconds,
            peak_rss_bytes: samples.peak_rss_sum(),
            peak_pss_bytes: samples.peak_pss_sum(),
            line,
            link,
        })
    }

    /// Runs the trainer script as `system`, a peer, by itself.
    fn run_python(
        &self,
        system: System,
        work_us: f64,
        mosaic_cache: Option<&Path>,
        sampling: Sampling,
    ) -> Result<(String, TrainerLine, TreeSamples)> {
        let mut command = self.python_command();
        command.args(self.trainer_arguments(system, work_us, mosaic_cache));
        let (run, samples) = run_sampled(&mut command, RUN_TIMEOUT, sampling)?;
        let line = last_json_line(&run.stdout).map_err(|reason| BenchError::CommandOutput {
            command: display(&command),
            stdout: run.stdout.clone(),
            reason,
        })?;
        Ok((display(&command), line, samples))
    }

    /// Runs a Sluice job whose one trainer runs `system`: `sluice am`, then the trainer, then, once the
    /// trainer has imported everything and started its clock, `sluice daemon`.
    fn run_sluice(
        &self,
        system: System,
        work_us: f64,
        sampling: Sampling,
    ) -> Result<(String, TrainerLine, TreeSamples)> {
        let directory = tempfile::Builder::new()
            .prefix("job-")
            .tempdir_in(self.work)
            .map_err(|source| BenchError::Setup {
                operation: format!("creating a job directory in {}", self.work.display()),
                source,
            })?;
        let spec = directory.path().join("job.yaml");
        // The ring lives where the daemon puts it by default, in /dev/shm (the temp dir may be a disk).
        let ring_root = crate::scratch_root();
        let ring_directory = tempfile::Builder::new()
            .prefix("sluice-bench-suite-")
            .tempdir_in(&ring_root)
            .map_err(|source| BenchError::Setup {
                operation: format!("creating a ring directory in {}", ring_root.display()),
                source,
            })?;
        let rings = ring_directory.path();
        let mut trainer_command = vec![self.python.to_string_lossy().into_owned()];
        trainer_command.extend(self.trainer_arguments(system, work_us, None));
        let storage_options = self
            .remote
            .as_ref()
            .map(|remote| remote.store.storage_options())
            .unwrap_or_default();
        std::fs::write(
            &spec,
            job_spec(
                &self.source.sluice_uri,
                &storage_options,
                &self.columns,
                &self.float_columns,
                self.task_rows,
                &trainer_command,
            ),
        )
        .map_err(|source| BenchError::Setup {
            operation: format!("writing {}", spec.display()),
            source,
        })?;

        let mut am_command = Command::new(self.sluice);
        am_command
            .arg("am")
            .arg(&spec)
            .args(["--listen", "127.0.0.1:0"])
            .env_remove("SLUICE_TOKEN");
        let mut am = Service::spawn(&mut am_command, directory.path().join("am.log"))?;
        let sampler = TreeSampler::start(am.child.id(), sampling);
        let address = am
            .wait_for_line(|line| line.contains(" serving on "), SERVICE_START_TIMEOUT)?
            .trim()
            .rsplit(' ')
            .next()
            .unwrap_or_default()
            .to_owned();

        let mut trainer = self.python_command();
        trainer
            .args(self.trainer_arguments(system, work_us, None))
            .env("SLUICE_RING", rings.join(JOB_NAME).join("0.ring"))
            .env("SLUICE_AM", &address)
            .env("SLUICE_RANK", "0")
            .env("SLUICE_WORLD_SIZE", "1")
            .env_remove("SLUICE_TOKEN");
        let shown = display(&trainer);
        let mut trainer = Service::spawn(&mut trainer, directory.path().join("trainer.log"))?;
        sampler.add_root(trainer.child.id());
        trainer.wait_for_line(|line| line.trim() == "ready", SERVICE_START_TIMEOUT)?;

        let mut daemon_command = Command::new(self.sluice);
        daemon_command
            .arg("daemon")
            .args(["--am", &address])
            .arg("--ring-dir")
            .arg(rings)
            .env_remove("SLUICE_TOKEN");
        let mut daemon = Service::spawn(&mut daemon_command, directory.path().join("daemon.log"))?;
        sampler.add_root(daemon.child.id());

        let stdout = match trainer.finish(RUN_TIMEOUT) {
            Ok(stdout) => stdout,
            Err(error) => {
                // What the services said tells why the trainer got no data.
                daemon.stop(Duration::ZERO);
                am.stop(Duration::ZERO);
                return Err(BenchError::JobFailed {
                    trainer: Box::new(error),
                    daemon: daemon.printed(),
                    am: am.printed(),
                });
            }
        };
        // The job is over once its one trainer is: the services get a moment to exit on their own.
        daemon.stop(SERVICE_STOP_TIMEOUT);
        am.stop(SERVICE_STOP_TIMEOUT);
        let samples = sampler.finish();
        let line = last_json_line(&stdout).map_err(|reason| BenchError::CommandOutput {
            command: shown.clone(),
            stdout: stdout.clone(),
            reason,
        })?;
        Ok((shown, line, samples))
    }
}

/// How long `sluice am` may take to serve, and a trainer to import its modules.
const SERVICE_START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the AM and the daemon may take to exit on their own after the job.
const SERVICE_STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// The job's name, which names its directory of rings.
const JOB_NAME: &str = "bench-suite";

/// A process of a Sluice run: stdout read line by line, stderr to a log file, killed when dropped.
struct Service {
    child: Child,
    shown: String,
    log: PathBuf,
    lines: Receiver<String>,
    stdout: String,
}

impl Service {
    fn spawn(command: &mut Command, log: PathBuf) -> Result<Service> {
        let shown = display(command);
        let stderr = std::fs::File::create(&log).map_err(|source| BenchError::Setup {
            operation: format!("creating {}", log.display()),
            source,
        })?;
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|source| BenchError::ToolMissing {
                program: command.get_program().to_string_lossy().into_owned(),
                purpose: format!("`{shown}`"),
                reason: source.to_string(),
                fix: "install it or put it on PATH".to_owned(),
            })?;
        let (sender, lines) = mpsc::channel();
        if let Some(stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if sender.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(Service {
            child,
            shown,
            log,
            lines,
            stdout: String::new(),
        })
    }

    fn failure(&mut self, problem: &str) -> BenchError {
        self.child.kill().ok();
        self.child.wait().ok();
        BenchError::CommandOutput {
            command: self.shown.clone(),
            stdout: self.stdout.clone(),
            reason: format!(
                "{problem}; its stderr: {}",
                std::fs::read_to_string(&self.log)
                    .unwrap_or_default()
                    .trim()
            ),
        }
    }

    /// Reads lines until one matches, and returns it.
    fn wait_for_line(
        &mut self,
        matches: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.stdout.push_str(&line);
                    self.stdout.push('\n');
                    if matches(&line) {
                        return Ok(line);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(self.failure(&format!("no expected line within {timeout:?}")));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(self.failure("exited before printing the expected line"));
                }
            }
        }
    }

    /// Waits for the process to exit successfully and returns everything it printed.
    fn finish(mut self, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.stdout.push_str(&line);
                    self.stdout.push('\n');
                }
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(self.failure(&format!("did not finish within {timeout:?}")));
                }
            }
        }
        let status = self.child.wait().map_err(|source| BenchError::Setup {
            operation: format!("waiting for `{}`", self.shown),
            source,
        })?;
        if status.success() {
            Ok(std::mem::take(&mut self.stdout))
        } else {
            Err(BenchError::CommandFailed {
                command: self.shown.clone(),
                status,
                stderr: std::fs::read_to_string(&self.log)
                    .unwrap_or_default()
                    .trim()
                    .to_owned(),
            })
        }
    }

    /// What the process printed so far: the lines of its stdout (to its end, once it exited, for
    /// at most a second more) and its stderr log.
    fn printed(&mut self) -> String {
        let exited = matches!(self.child.try_wait(), Ok(Some(_)));
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let next = if exited {
                self.lines
                    .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                    .ok()
            } else {
                self.lines.try_recv().ok()
            };
            let Some(line) = next else { break };
            self.stdout.push_str(&line);
            self.stdout.push('\n');
        }
        format!(
            "`{}` printed:\n{}\nand logged:\n{}",
            self.shown,
            self.stdout.trim(),
            std::fs::read_to_string(&self.log)
                .unwrap_or_default()
                .trim()
        )
    }

    /// Gives the process `grace` to exit, then kills it.
    fn stop(&mut self, grace: Duration) {
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.child.kill().ok();
        }
        self.child.wait().ok();
    }
}

/// Whether a process of the tree is the node daemon: `sluice daemon ...`.
fn is_sluice_daemon(process: &TreeProcess) -> bool {
    process
        .arguments
        .get(1)
        .is_some_and(|verb| verb == "daemon")
}

/// Parses the last line of `text` that starts with `{`.
fn last_json_line<T: for<'de> Deserialize<'de>>(text: &str) -> std::result::Result<T, String> {
    let line = text
        .lines()
        .rev()
        .find(|line| line.starts_with('{'))
        .ok_or_else(|| "no JSON line".to_owned())?;
    serde_json::from_str(line).map_err(|error| format!("not the trainer script's JSON: {error}"))
}

/// The job spec of the Sluice systems: one daemon, one trainer, all the data, read with
/// `storage_options` (none for local files). The daemon turns the nulls of `float_columns` into
/// NaN (`data.transforms`), the preprocessing a Sluice job moves off its trainers, so that the
/// trainer's conversion to tensors finds none. `sluice am` launches no executor; the role's
/// command records what the suite starts as the trainer.
fn job_spec(
    uri: &str,
    storage_options: &BTreeMap<String, String>,
    columns: &[String],
    float_columns: &[String],
    task_rows: u64,
    trainer: &[String],
) -> String {
    let command = serde_json::to_string(trainer).unwrap_or_default();
    let storage_options = if storage_options.is_empty() {
        String::new()
    } else {
        format!(
            ", storage_options: {}",
            serde_json::to_string(storage_options).unwrap_or_default()
        )
    };
    let transforms: Vec<String> = float_columns
        .iter()
        .map(|column| {
            format!(
                r#"{{ fill_null: {{ column: {}, value: "NaN" }} }}"#,
                serde_json::to_string(column).unwrap_or_default()
            )
        })
        .collect();
    format!(
        r#"name: {JOB_NAME}
data:
  sources: [{{ uri: {uri}, format: parquet, columns: {columns}{storage_options} }}]
  batch_size: {BATCH_ROWS}
  task_rows: {task_rows}
  transforms: [{transforms}]
nodes: 1
roles:
  - {{ name: worker, num: 1, command: {command} }}
failover: {{ restart: never }}
"#,
        uri = serde_json::to_string(uri).unwrap_or_default(),
        columns = serde_json::to_string(columns).unwrap_or_default(),
        transforms = transforms.join(", "),
    )
}

impl SuiteReport {
    /// The report as one JSON object.
    ///
    /// # Errors
    ///
    /// Returns serde's error, which a report of finite numbers never produces.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(self)
    }

    /// The rows of the table and of the chart, in order: the label and the figures.
    fn rows(&self) -> Vec<(String, &SystemFigures)> {
        let mut rows = Vec::new();
        for name in ["sluice", "sluice_torch"]
            .into_iter()
            .chain(PEERS)
            .chain(["ring", "memcpy", "link"])
        {
            let Some(counts) = self.by_workers.get(name) else {
                if let Some(figures) = self.systems.get(name) {
                    rows.push((name.to_owned(), figures));
                }
                continue;
            };
            let best = self.systems.get(name).and_then(|best| best.num_workers);
            for figures in counts {
                let workers = figures.num_workers.unwrap_or_default();
                let mark = if counts.len() > 1 && best == Some(workers) {
                    " *"
                } else {
                    ""
                };
                rows.push((
                    format!("{name} ({}){mark}", workers_label(workers)),
                    figures,
                ));
            }
        }
        rows
    }

    /// The bars of the chart: rows/s to an idle trainer per row of the table.
    pub fn chart_bars(&self) -> Vec<(String, f64)> {
        self.rows()
            .into_iter()
            .map(|(label, figures)| {
                (
                    label
                        .replace("pytorch_dataloader_naive", "naive")
                        .replace("pytorch_dataloader", "DL")
                        .replace("mosaic_streaming", "mosaic")
                        .replace(" (", " ")
                        .replace(" workers)", "w")
                        .replace(" worker)", "w")
                        .replace(" *", ""),
                    figures.rows_per_s,
                )
            })
            .collect()
    }

    /// The chart's title.
    pub fn chart_title(&self) -> String {
        let link = self.remote.as_ref().map_or_else(String::new, |remote| {
            format!(
                ", from S3 over a link of {:.0} ms and {:.0} MB/s",
                remote.delay_ms,
                remote.bandwidth_bytes_per_s as f64 / 1e6
            )
        });
        format!(
            "rows/s to one idle trainer, {} rows in batches of {}{link}",
            self.rows, self.batch_rows
        )
    }

    /// The report as a table for people.
    pub fn render_table(&self) -> String {
        let mut out = match &self.remote {
            Some(remote) => self.render_remote_table(remote),
            None => self.render_local_table(),
        };
        for (name, reason) in &self.not_installed {
            writeln!(out, "{name:<36} not installed: {reason}").ok();
        }
        if !self.left_out.is_empty() {
            writeln!(out, "left out by --systems: {}", self.left_out.join(", ")).ok();
        }
        writeln!(
            out,
            "* the worker count with {}, the system's figure; versions: {}",
            if self.remote.is_some() {
                "the most rows/s"
            } else {
                "the lowest data overhead at 1×"
            },
            self.versions
                .iter()
                .map(|(name, version)| format!("{name} {version}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
        .ok();
        let targets: Vec<String> = self
            .targets
            .iter()
            .map(|target| {
                format!(
                    "{}{} {:.2} ({} {}: {})",
                    target.figure,
                    target
                        .best_peer
                        .as_ref()
                        .map(|peer| format!(" [{peer}]"))
                        .unwrap_or_default(),
                    target.measured,
                    if target.at_most { "≤" } else { "≥" },
                    target.bound,
                    if target.met { "met" } else { "NOT met" }
                )
            })
            .collect();
        writeln!(out, "targets: {}", targets.join("; ")).ok();
        out
    }

    /// The header line and the rows of a remote run: the idle phase's figures and the link's.
    fn render_remote_table(&self, remote: &RemoteReport) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        writeln!(
            out,
            "sluice bench suite --remote: {} rows of {} (columns {}: {:.1} MB as Parquet, {:.1} MB as Arrow) in batches of {}, over a link of {:.0} ms before every response's first byte and {:.1} MB/s ({:.0} Mbit/s); idle trainers, median of {} round(s); load average {} at start, {} at end",
            self.rows,
            self.source,
            self.columns.join(","),
            remote.parquet_bytes as f64 / 1e6,
            self.arrow_bytes as f64 / 1e6,
            self.batch_rows,
            remote.delay_ms,
            remote.bandwidth_bytes_per_s as f64 / 1e6,
            remote.bandwidth_bytes_per_s as f64 * 8.0 / 1e6,
            self.rounds,
            format_load(self.load_average_start),
            format_load(self.load_average_end),
        )
        .ok();
        let parquet_bytes = remote.parquet_bytes as f64;
        let columns = [
            Column::figure("MB read", 9, |figures| {
                optional(figures.link_bytes.map(|bytes| bytes as f64 / 1e6), 1)
            }),
            Column::figure("÷ needed", 9, move |figures| {
                optional(
                    figures.link_bytes.map(|bytes| bytes as f64 / parquet_bytes),
                    2,
                )
            }),
            Column::figure("link %", 7, |figures| {
                optional(figures.link_fraction.map(|fraction| fraction * 100.0), 1)
            }),
        ];
        self.render_rows(&mut out, columns);
        writeln!(
            out,
            "MB read: through the link over the run; ÷ needed: over the delivered columns' Parquet bytes ({:.1} MB{}); link %: the link's bytes in the trainer's window over bandwidth × window",
            remote.parquet_bytes as f64 / 1e6,
            remote.mds_bytes.map_or_else(String::new, |bytes| format!(
                "; MosaicML Streaming reads MDS, {:.1} MB",
                bytes as f64 / 1e6
            )),
        )
        .ok();
        out
    }

    /// The header line and the rows of a local run.
    fn render_local_table(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        writeln!(
            out,
            "sluice bench suite: {} rows of {} (columns {}: {:.1} MB as Arrow, {:.1} B/row) in batches of {} ({} B as Arrow IPC); median of {} round(s); work {:.1} µs per batch ({}), and half and twice that; load average {} at start, {} at end",
            self.rows,
            self.source,
            self.columns.join(","),
            self.arrow_bytes as f64 / 1e6,
            self.arrow_bytes as f64 / self.rows as f64,
            self.batch_rows,
            self.record_bytes,
            self.rounds,
            self.work_us.unwrap_or_default(),
            if self.work_us_given {
                "--work-us"
            } else {
                "the daemon's CPU per batch"
            },
            format_load(self.load_average_start),
            format_load(self.load_average_end),
        )
        .ok();
        let columns = [
            Column::figure("ovh ½×", 7, |figures| {
                optional(figures.data_overhead_half_work, 2)
            }),
            Column::figure("ovh 1×", 7, |figures| optional(figures.data_overhead, 2)),
            Column::figure("ovh 2×", 7, |figures| {
                optional(figures.data_overhead_double_work, 2)
            }),
            Column::figure("stall %", 7, |figures| optional(figures.stall_percent, 1)),
        ];
        self.render_rows(&mut out, columns);
        out
    }

    /// The header line and a row per system: the figures every table has, `middle` between the
    /// trainer's CPU and the peak memory.
    fn render_rows<'a>(&'a self, out: &mut String, middle: impl IntoIterator<Item = Column<'a>>) {
        let columns: Vec<Column<'a>> = [
            Column::figure("M rows/s", 9, |figures| {
                format!("{:.3}", figures.rows_per_s / 1e6)
            }),
            Column::figure("steady", 9, |figures| {
                optional(figures.rows_per_s_steady.map(|rows| rows / 1e6), 3)
            }),
            Column::figure("1st s", 6, |figures| optional(figures.first_batch_s, 2)),
            Column::figure("CPU s/M", 9, |figures| optional(figures.cpu_s_per_mrows, 2)),
            Column::figure("trainer", 9, |figures| {
                optional(figures.trainer_cpu_s_per_mrows, 2)
            }),
        ]
        .into_iter()
        .chain(middle)
        .chain([
            Column::figure("peak PSS", 9, |figures| {
                figures.peak_pss_bytes.map_or_else(
                    || "-".to_owned(),
                    |bytes| format!("{:.0} MB", bytes as f64 / 1e6),
                )
            }),
            Column::figure("÷ sluice", 8, |figures| {
                format!("{:.3}x", figures.ratio_to_sluice)
            }),
        ])
        .collect();
        // Writing to a String cannot fail.
        write!(out, "{:<36}", "system").ok();
        for column in &columns {
            write!(out, " {:>width$}", column.header, width = column.width).ok();
        }
        writeln!(out).ok();
        for (label, figures) in self.rows() {
            write!(out, "{label:<36}").ok();
            for column in &columns {
                write!(
                    out,
                    " {:>width$}",
                    (column.cell)(figures),
                    width = column.width
                )
                .ok();
            }
            writeln!(out).ok();
        }
    }
}

/// One column of the suite's table: its header, its width, and its cell for a system's figures.
struct Column<'a> {
    header: &'static str,
    width: usize,
    cell: Box<dyn Fn(&SystemFigures) -> String + 'a>,
}

impl<'a> Column<'a> {
    fn figure(
        header: &'static str,
        width: usize,
        cell: impl Fn(&SystemFigures) -> String + 'a,
    ) -> Column<'a> {
        Column {
            header,
            width,
            cell: Box::new(cell),
        }
    }
}

/// A figure with `precision` decimals, or `-` where the system has none.
fn optional(value: Option<f64>, precision: usize) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("{value:.precision$}"))
}

#[cfg(test)]
mod tests {
    use sluice_am::spec::{Format, JobSpec, TransformSpec};

    use super::*;

    #[test]
    fn a_failed_job_names_what_its_services_printed() {
        let directory = tempfile::tempdir().expect("tempdir");
        let mut daemon = Service::spawn(
            Command::new("sh").args(["-c", "echo registered; echo refused by the AM >&2"]),
            directory.path().join("daemon.log"),
        )
        .expect("spawn");
        daemon.stop(Duration::from_secs(10));
        let error = BenchError::JobFailed {
            trainer: Box::new(BenchError::CommandOutput {
                command: "python trainer.py".to_owned(),
                stdout: String::new(),
                reason: "no ring".to_owned(),
            }),
            daemon: daemon.printed(),
            am: "`sluice am` printed nothing".to_owned(),
        };
        let message = error.to_string();
        for part in [
            "no ring",
            "registered",
            "refused by the AM",
            "the AM: `sluice am`",
        ] {
            assert!(message.contains(part), "{part:?} in {message}");
        }
    }

    #[test]
    fn the_job_runs_the_trainer_script_as_its_one_trainer() {
        let trainer = [
            "python3".to_owned(),
            "/tmp/w/suite_trainer.py".to_owned(),
            "sluice".to_owned(),
            "--work-us".to_owned(),
            "12.5".to_owned(),
        ];
        let columns = ["id".to_owned(), "score".to_owned(), "label".to_owned()];
        let spec = job_spec(
            "file:///data/suite dir",
            &BTreeMap::new(),
            &columns,
            &columns[1..2],
            1 << 15,
            &trainer,
        );
        let job = JobSpec::parse(&spec, Format::Yaml).expect("a valid job spec");
        assert_eq!(job.nodes, 1);
        assert_eq!(job.roles.len(), 1);
        assert_eq!(job.roles[0].num, 1);
        assert_eq!(job.roles[0].command, trainer);
        assert_eq!(job.data.batch_size as usize, BATCH_ROWS);
        assert_eq!(job.data.sources[0].uri, "file:///data/suite dir");
        assert_eq!(job.data.sources[0].columns.as_deref(), Some(&columns[..]));
        assert!(job.data.sources[0].storage_options.is_empty());
        assert_eq!(
            job.data.transforms,
            [TransformSpec::FillNull {
                column: "score".to_owned(),
                value: "NaN".to_owned(),
            }]
        );
    }

    #[test]
    fn a_remote_job_reads_with_the_storage_options_of_the_link() {
        let options = BTreeMap::from([
            (
                "aws_endpoint".to_owned(),
                "http://127.0.0.1:40001".to_owned(),
            ),
            ("aws_allow_http".to_owned(), "true".to_owned()),
        ]);
        let spec = job_spec(
            "s3://sluice-test/suite/data",
            &options,
            &["id".to_owned()],
            &[],
            1 << 15,
            &["python3".to_owned()],
        );
        let job = JobSpec::parse(&spec, Format::Yaml).expect("a valid job spec");
        assert_eq!(job.data.sources[0].uri, "s3://sluice-test/suite/data");
        assert_eq!(job.data.sources[0].storage_options, options);
    }

    fn run(line: TrainerLine, daemon_cpu_seconds: f64) -> TrainerRun {
        TrainerRun {
            line,
            cpu_seconds: 1.0,
            trainer_cpu_seconds: 0.5,
            daemon_cpu_seconds,
            peak_rss_bytes: 1,
            peak_pss_bytes: 1,
            link: None,
        }
    }

    #[test]
    fn stall_steady_rows_and_overhead_leave_out_or_count_the_first_batch() {
        let sut = run(
            TrainerLine {
                pid: 1,
                rows: 100,
                batches: 10,
                seconds: 3.0,
                first_batch_seconds: 1.0,
                first_batch_rows: 10,
                wait_seconds: 0.5,
                window_start_ns: 0,
                window_end_ns: 3_000_000_000,
            },
            0.2,
        );
        assert_eq!(sut.stall_percent(), 25.0);
        assert!((sut.rows_per_s() - 100.0 / 3.0).abs() < 1e-9);
        assert!((sut.rows_per_s_steady() - 45.0).abs() < 1e-9);
        // 10 batches of 200 ms of work: 2 s of compute in a 3 s epoch.
        assert!((sut.data_overhead(200_000.0) - 1.5).abs() < 1e-9);
        let per_batch = daemon_us_per_batch(std::slice::from_ref(&sut)).expect("measured");
        assert!((per_batch - 20_000.0).abs() < 1e-6, "{per_batch}");
    }

    #[test]
    fn a_daemon_that_used_no_cpu_asks_for_work_us() {
        let sut = run(
            TrainerLine {
                pid: 1,
                rows: 1,
                batches: 1,
                seconds: 1.0,
                first_batch_seconds: 0.5,
                first_batch_rows: 1,
                wait_seconds: 0.0,
                window_start_ns: 0,
                window_end_ns: 1,
            },
            0.0,
        );
        let error = daemon_us_per_batch(&[sut]).expect_err("no daemon CPU");
        assert!(error.to_string().contains("--work-us"), "{error}");
    }

    #[test]
    fn the_daemon_is_told_from_the_am_and_the_trainer_by_the_subcommand() {
        let process = |arguments: &[&str]| TreeProcess {
            pid: 1,
            arguments: arguments.iter().map(|a| (*a).to_owned()).collect(),
            peak_rss_bytes: 0,
        };
        assert!(is_sluice_daemon(&process(&[
            "/bin/sluice",
            "daemon",
            "--am",
            "x"
        ])));
        assert!(!is_sluice_daemon(&process(&[
            "/bin/sluice",
            "am",
            "/tmp/daemon/job.yaml"
        ])));
        assert!(!is_sluice_daemon(&process(&[
            "python3",
            "suite_trainer.py",
            "daemon"
        ])));
    }

    #[test]
    fn targets_compare_sluice_with_the_best_peer_at_each_figure() {
        let figures = |overhead: f64, steady: f64, cpu: f64, trainer_cpu: f64| SystemFigures {
            rows_per_s: 1.0,
            gb_per_s: 1.0,
            rows_per_s_steady: Some(steady),
            first_batch_s: Some(0.1),
            cpu_s_per_mrows: Some(cpu),
            trainer_cpu_s_per_mrows: Some(trainer_cpu),
            data_overhead: Some(overhead),
            data_overhead_half_work: Some(overhead),
            data_overhead_double_work: Some(overhead),
            stall_percent: Some(0.0),
            peak_rss_bytes: Some(1),
            peak_pss_bytes: Some(1),
            rows: Some(1),
            num_workers: None,
            ratio_to_sluice: 1.0,
            link_bytes: None,
            link_fraction: None,
        };
        let sluice = figures(1.02, 6.0, 0.2, 0.05);
        let systems = BTreeMap::from([
            ("sluice".to_owned(), sluice.clone()),
            // Sluice's own torch Dataset is no peer, however good its figures.
            ("sluice_torch".to_owned(), figures(1.0, 9.0, 0.1, 0.01)),
            ("pyarrow".to_owned(), figures(2.04, 4.0, 0.5, 0.5)),
            ("pytorch_dataloader".to_owned(), figures(3.0, 5.0, 0.3, 0.1)),
        ]);
        let sut = targets(&sluice, &systems);
        let by_figure = |start: &str| {
            sut.iter()
                .find(|target| target.figure.starts_with(start))
                .unwrap_or_else(|| panic!("no target {start}: {sut:?}"))
        };
        assert!(by_figure("sluice data overhead").met);
        let epoch = by_figure("the best peer's epoch");
        assert_eq!(epoch.best_peer.as_deref(), Some("pyarrow"));
        assert!(
            (epoch.measured - 2.0).abs() < 1e-9 && epoch.met,
            "{epoch:?}"
        );
        let steady = by_figure("sluice's steady rows/s");
        assert_eq!(steady.best_peer.as_deref(), Some("pytorch_dataloader"));
        assert!(
            (steady.measured - 1.2).abs() < 1e-9 && steady.met,
            "{steady:?}"
        );
        let trainer = by_figure("sluice's CPU per row ÷ the best peer's, the trainer");
        assert!(
            (trainer.measured - 0.5).abs() < 1e-9 && !trainer.met,
            "{trainer:?}"
        );
    }

    #[test]
    fn both_tables_line_up_their_headers_and_figures() {
        let sluice = SystemFigures {
            rows_per_s: 3_780_000.0,
            gb_per_s: 1.0,
            rows_per_s_steady: Some(4_012_345.0),
            first_batch_s: Some(0.284),
            cpu_s_per_mrows: Some(0.511),
            trainer_cpu_s_per_mrows: None,
            data_overhead: Some(1.031),
            data_overhead_half_work: Some(1.06),
            data_overhead_double_work: Some(1.004),
            stall_percent: Some(2.25),
            peak_rss_bytes: Some(1),
            peak_pss_bytes: Some(412_000_000),
            rows: Some(1),
            num_workers: None,
            ratio_to_sluice: 1.0,
            link_bytes: Some(52_400_000),
            link_fraction: Some(0.734),
        };
        let mut sut = SuiteReport {
            source: "generated".to_owned(),
            rows: 2_000_000,
            columns: vec!["id".to_owned()],
            arrow_bytes: 16_000_000,
            batch_rows: 4096,
            record_bytes: 32_768,
            work_us: Some(120.0),
            work_us_given: false,
            rounds: 3,
            python: "python3".to_owned(),
            versions: BTreeMap::new(),
            load_average_start: None,
            load_average_end: None,
            systems: BTreeMap::from([("sluice".to_owned(), sluice)]),
            by_workers: BTreeMap::new(),
            not_installed: BTreeMap::new(),
            left_out: Vec::new(),
            targets: Vec::new(),
            remote: None,
        };
        let local = sut.render_table();
        let lines: Vec<&str> = local.lines().collect();
        assert_eq!(
            lines[1],
            "system                                M rows/s    steady  1st s   CPU s/M   trainer  ovh ½×  ovh 1×  ovh 2× stall %  peak PSS ÷ sluice"
        );
        assert_eq!(
            lines[2],
            "sluice                                   3.780     4.012   0.28      0.51         -    1.06    1.03    1.00     2.2    412 MB   1.000x"
        );
        sut.remote = Some(RemoteReport {
            uri: "s3://bench/suite".to_owned(),
            mds_uri: None,
            delay_ms: 20.0,
            bandwidth_bytes_per_s: 50_000_000,
            file_bytes: 60_000_000,
            parquet_bytes: 52_400_000,
            mds_bytes: None,
        });
        let remote = sut.render_table();
        let lines: Vec<&str> = remote.lines().collect();
        assert_eq!(
            lines[1],
            "system                                M rows/s    steady  1st s   CPU s/M   trainer   MB read  ÷ needed  link %  peak PSS ÷ sluice"
        );
        assert_eq!(
            lines[2],
            "sluice                                   3.780     4.012   0.28      0.51         -      52.4      1.00    73.4    412 MB   1.000x"
        );
    }

    #[test]
    fn a_missing_source_names_the_fix() {
        let error = DataSource::given("/nonexistent/sluice-suite-data").expect_err("missing");
        assert!(error.to_string().contains("--source"), "{error}");
        let uri = DataSource::given("s3://bucket/train").expect("a URI is taken as it is");
        assert_eq!(uri.sluice_uri, "s3://bucket/train");
    }
}

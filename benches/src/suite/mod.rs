//! `sluice-bench suite`: Sluice against what users feed their trainers with today, side by side, in one
//! run, on the same data.
//!
//! The data is generated once by `sluice gen` into the cache directory (or is the user's, with
//! `--source`). Every system delivers all of it, in batches of [`BATCH_ROWS`] rows, to a Python trainer
//! loop (`benches/python/suite_trainer.py`):
//!
//! - `sluice`: the AM (`sluice am JOB`), one node daemon (`sluice daemon`) and the real ring, with the
//!   trainer reading `sluice.Reader`; `sluice_torch`: the same with the trainer iterating
//!   `DataLoader(sluice.torch.Dataset(), batch_size=None)`. The AM is serving before the trainer starts,
//!   and the daemon is started once the trainer has imported its modules and started its clock, so all
//!   of the daemon's work (its start, registering, acquiring tasks, fetch, decode, ring writes) falls in
//!   the trainer's window, as the start of a DataLoader's workers falls in its own. (Under
//!   `sluice run` the AM launches the daemon and the trainer together, and the daemon would fill the
//!   ring while the trainer imports torch.)
//! - `pytorch_dataloader`: a `DataLoader` over a Dataset that reads the Parquet row groups with
//!   pyarrow, split among its workers, yields one dict per row and is batched by the default collate,
//!   with 0, 1 and 2 workers; the best worker count is the system's figure;
//! - `pyarrow`: a `pyarrow.dataset` scan to record batches in the trainer's process, the single-node
//!   ceiling;
//! - `mosaic_streaming` and `ray_data` when they are importable (never installed for this benchmark);
//! - `ring` and `memcpy`: the ring benchmark's ring and memcpy at the size of one batch of this data as
//!   Arrow IPC, as the physical limit: rows/s = records/s × rows per batch.
//!
//! Figures per system:
//!
//! - rows/s over the trainer's window: from the start of its loop (opening the reader, creating the
//!   iterator) to the end of the data, as the trainer measures it;
//! - GB/s: rows/s × the Arrow bytes per row of the data (the Arrow IPC size of its batches, measured
//!   once by pyarrow), the same definition for every system;
//! - CPU seconds per million rows: the CPU time, within the trainer's window, of every process of the
//!   system (see [`process_tree`]): for Sluice the AM, the daemon and the trainer; for a DataLoader its
//!   main process and its workers;
//! - peak RSS: the sum over the same processes of each one's peak resident set (`VmHWM`), over its whole
//!   life. Pages shared between processes count once per process that touched them: the ring's
//!   shared memory in the daemon and in the trainer, the pages a DataLoader worker shares with the main
//!   process it was forked from;
//! - stall %: in a second phase the trainer spins `W` µs per batch (`--work-us`, by default the daemon's
//!   CPU time per batch in the first phase); stall % is the time the trainer waited for its next batch
//!   over the time from its first batch to its end. The wait for the first batch (the start of the
//!   system) is left out of both and shown apart.
//!
//! Rounds rotate the order of the systems; the figures are the medians over the rounds. The ring and
//! memcpy have no processes or trainer of their own: their CPU, stall and RSS are `None` (`null` in
//! the JSON, `-` in the table).

pub mod chart;
pub mod process_tree;

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
use process_tree::{TreeProcess, TreeSampler, TreeSamples};

/// Rows per batch for every system, a common training batch.
pub const BATCH_ROWS: usize = 4096;
/// The DataLoader worker counts that are run.
pub const DATALOADER_WORKERS: [u32; 3] = [0, 1, 2];
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

/// The data of a full run: 2 million rows in 8 files.
pub const FULL_DATA: SuiteData = SuiteData {
    rows: 2_000_000,
    files: 8,
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
    /// The directory of this data in `cache_dir`; the name carries every parameter of the content.
    pub fn directory_in(&self, cache_dir: &Path) -> PathBuf {
        cache_dir.join(format!(
            "suite-v1-{}rows-{}files-{}rg",
            self.rows, self.files, self.row_group_rows
        ))
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
    /// The Python interpreter with pyarrow, torch and the `sluice` package.
    pub python: OsString,
    /// Where the generated data is written once and then reused.
    pub cache_dir: PathBuf,
    /// Small data and one round, for CI.
    pub quick: bool,
    /// Rounds (at least 1); one with `quick`.
    pub rounds: usize,
    /// The user's data instead of the generated data: a Parquet file or directory, or a URI.
    pub source: Option<String>,
    /// The trainer's work per batch in the stall phase, µs; by default the daemon's CPU per batch.
    pub work_us: Option<f64>,
    /// How the ring benchmark starts its producer process.
    pub peer: PeerCommand,
}

/// The systems that run as a trainer process (or a job with one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum System {
    Sluice,
    SluiceTorch,
    DataLoader(u32),
    Pyarrow,
    MosaicStreaming,
    RayData,
}

impl System {
    /// The system's name in the JSON and the trainer script's system argument.
    fn name(self) -> &'static str {
        match self {
            System::Sluice => "sluice",
            System::SluiceTorch => "sluice_torch",
            System::DataLoader(_) => "pytorch_dataloader",
            System::Pyarrow => "pyarrow",
            System::MosaicStreaming => "mosaic_streaming",
            System::RayData => "ray_data",
        }
    }

    /// The name in the table and in progress lines.
    fn label(self) -> String {
        match self {
            System::DataLoader(1) => "pytorch_dataloader (1 worker)".to_owned(),
            System::DataLoader(workers) => format!("pytorch_dataloader ({workers} workers)"),
            other => other.name().to_owned(),
        }
    }

    fn is_sluice(self) -> bool {
        matches!(self, System::Sluice | System::SluiceTorch)
    }
}

/// One measured entry of a round: a trainer system or one of the two physical limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Trainer(System),
    Ring,
    Memcpy,
}

/// The JSON line of the trainer script.
#[derive(Debug, Clone, Deserialize)]
struct TrainerLine {
    rows: u64,
    batches: u64,
    seconds: f64,
    first_batch_seconds: f64,
    wait_seconds: f64,
    window_start_ns: u64,
    window_end_ns: u64,
}

/// The JSON line of the trainer script's `facts`.
#[derive(Debug, Clone, Copy, Deserialize)]
struct Facts {
    rows: u64,
    arrow_bytes: u64,
    batches: u64,
}

/// The JSON line of the trainer script's `probe`: which optional systems are importable.
#[derive(Debug, Clone, Copy, Deserialize)]
struct Probe {
    mosaic_streaming: bool,
    ray_data: bool,
}

/// One run of a trainer system.
#[derive(Debug, Clone)]
struct TrainerRun {
    line: TrainerLine,
    cpu_seconds: f64,
    daemon_cpu_seconds: f64,
    peak_rss_bytes: u64,
}

impl TrainerRun {
    fn rows_per_s(&self) -> f64 {
        self.line.rows as f64 / self.line.seconds
    }

    fn stall_percent(&self) -> f64 {
        let after_first = self.line.seconds - self.line.first_batch_seconds;
        100.0 * self.line.wait_seconds / after_first.max(f64::MIN_POSITIVE)
    }
}

/// The figures of one system, medians over the rounds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SystemFigures {
    /// Rows per second delivered to the trainer (throughput phase).
    pub rows_per_s: f64,
    /// Arrow gigabytes (1e9 bytes) per second: rows/s × the data's Arrow bytes per row.
    pub gb_per_s: f64,
    /// CPU seconds of all the system's processes per million rows (throughput phase); `None` for the
    /// physical limits, which have no processes of their own.
    pub cpu_s_per_mrows: Option<f64>,
    /// Percent of the trainer's time spent waiting for a batch (work phase); `None` for the limits.
    pub stall_percent: Option<f64>,
    /// The sum of the peak RSS of the system's processes (throughput phase); `None` for the limits.
    pub peak_rss_bytes: Option<u64>,
    /// Seconds until the trainer had its first batch (work phase); `None` for the limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_batch_s: Option<f64>,
    /// The rows the trainer received in every run; `None` for the limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
    /// The DataLoader's worker count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_workers: Option<u32>,
    /// Rows/s over sluice's rows/s.
    pub ratio_to_sluice: f64,
}

/// The suite's targets, recorded against the figures (not asserted).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Targets {
    /// Sluice's rows/s over the best DataLoader's; the target is at least 5.
    pub sluice_over_dataloader: f64,
    /// Sluice's rows/s over pyarrow's; the target is at least 0.9.
    pub sluice_over_pyarrow: f64,
    /// Sluice's stall % in the work phase; the target is below 1.
    pub sluice_stall_percent: f64,
}

impl Targets {
    const DATALOADER: f64 = 5.0;
    const PYARROW: f64 = 0.9;
    const STALL_PERCENT: f64 = 1.0;
}

/// Everything one `sluice-bench suite` run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SuiteReport {
    /// The data every system read.
    pub source: String,
    /// Rows in the data.
    pub rows: u64,
    /// Its size as Arrow IPC record batches of `batch_rows` rows.
    pub arrow_bytes: u64,
    /// Rows per batch for every system.
    pub batch_rows: usize,
    /// The ring's and memcpy's record size: the mean Arrow IPC bytes of one batch.
    pub record_bytes: usize,
    /// The trainer's work per batch in the work phase, µs.
    pub work_us: f64,
    /// Whether `work_us` was given (`--work-us`) or measured (the daemon's CPU per batch).
    pub work_us_given: bool,
    /// Rounds of each phase.
    pub rounds: usize,
    /// The 1-minute load average when the run started.
    pub load_average_start: Option<f64>,
    /// The 1-minute load average when the run ended.
    pub load_average_end: Option<f64>,
    /// The figures by system name.
    pub systems: BTreeMap<String, SystemFigures>,
    /// Every DataLoader worker count that was run, in order.
    pub pytorch_dataloader_by_workers: Vec<SystemFigures>,
    /// Optional systems that are not importable here, so not measured.
    pub not_installed: Vec<String>,
    /// The ratios the targets are about.
    pub targets: Targets,
}

/// Runs the suite; `progress` receives one line per finished run.
///
/// # Errors
///
/// Returns an error when a program is missing (pyarrow, torch, the `sluice` package), the data cannot
/// be generated, a system fails or delivers another number of rows than the data holds.
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
        && !(work_us.is_finite() && work_us >= 0.0)
    {
        return Err(BenchError::InvalidOption {
            option: "--work-us".to_owned(),
            reason: format!("{work_us} is not a duration; give microseconds, e.g. --work-us 500"),
        });
    }
    check_pyarrow(&options.python)?;
    check_trainer_modules(&options.python)?;
    let load_average_start = load_average();
    let rounds = if options.quick { 1 } else { options.rounds };
    let data = if options.quick { QUICK_DATA } else { FULL_DATA };
    let work = tempfile::tempdir().map_err(|source| BenchError::Setup {
        operation: "creating a directory for the suite's job, rings and scripts".to_owned(),
        source,
    })?;
    let script = work.path().join(TRAINER_FILE);
    std::fs::write(&script, TRAINER_SCRIPT).map_err(|source| BenchError::Setup {
        operation: format!("writing {}", script.display()),
        source,
    })?;
    let source = match &options.source {
        Some(source) => DataSource::given(source)?,
        None => {
            let directory = data.directory_in(&options.cache_dir);
            if !directory.join(SUCCESS_MARKER).exists() {
                progress(&format!(
                    "generating {} rows in {}",
                    data.rows,
                    directory.display()
                ));
            }
            DataSource::local(&data.ensure(&options.sluice, &options.cache_dir)?)
        }
    };
    progress(&format!("data: {}", source.python));
    let runner = Runner {
        options,
        script: &script,
        work: work.path(),
        source: &source,
        task_rows: data.task_rows,
    };
    // The facts pass reads every row once, which also warms the page cache for every system.
    let facts: Facts = runner.python_json(&["facts"])?;
    if facts.rows == 0 || facts.batches == 0 {
        return Err(BenchError::InvalidOption {
            option: "--source".to_owned(),
            reason: format!("{} holds no rows; give a dataset with rows", source.python),
        });
    }
    let probe: Probe = runner.python_json(&["probe"])?;
    let bytes_per_row = facts.arrow_bytes as f64 / facts.rows as f64;
    let record_bytes = usize::try_from(facts.arrow_bytes.div_ceil(facts.batches))
        .unwrap_or(usize::MAX)
        .max(crate::workload::MIN_RECORD_SIZE);
    let rows_per_record = facts.rows as f64 / facts.batches as f64;
    progress(&format!(
        "{} rows, {:.1} MB as Arrow ({bytes_per_row:.1} B/row), {record_bytes} B per batch",
        facts.rows,
        facts.arrow_bytes as f64 / 1e6
    ));

    let mut systems = vec![System::Sluice, System::SluiceTorch];
    systems.extend(DATALOADER_WORKERS.map(System::DataLoader));
    systems.push(System::Pyarrow);
    let mut not_installed = Vec::new();
    for (system, importable) in [
        (System::MosaicStreaming, probe.mosaic_streaming),
        (System::RayData, probe.ray_data),
    ] {
        if importable {
            systems.push(system);
        } else {
            not_installed.push(system.name().to_owned());
        }
    }
    let mut entries: Vec<Entry> = systems.iter().copied().map(Entry::Trainer).collect();
    entries.extend([Entry::Ring, Entry::Memcpy]);

    let ring_options = RingBenchOptions {
        sizes: vec![record_bytes],
        quick: options.quick,
        peer: options.peer.clone(),
    };
    let mut transports = TransportBench::new(&ring_options)?;
    let mut throughput: BTreeMap<System, Vec<TrainerRun>> = BTreeMap::new();
    let mut ring_rows_per_s = Vec::new();
    let mut memcpy_rows_per_s = Vec::new();
    for round in 0..rounds {
        for offset in 0..entries.len() {
            let entry = entries[(round + offset) % entries.len()];
            let label = format!("throughput round {}", round + 1);
            match entry {
                Entry::Trainer(system) => {
                    let run = runner.run(system, 0.0, facts.rows)?;
                    progress(&format!(
                        "{label}: {}: {:.3} M rows/s, {:.2} CPU s",
                        system.label(),
                        run.rows_per_s() / 1e6,
                        run.cpu_seconds
                    ));
                    throughput.entry(system).or_default().push(run);
                }
                Entry::Ring => {
                    let measurement = transports.measure(Transport::SluiceRing, record_bytes)?;
                    let rows_per_s = measurement.msgs_per_s() * rows_per_record;
                    progress(&format!(
                        "{label}: ring: {:.0} records/s of {record_bytes} B, {:.3} M rows/s",
                        measurement.msgs_per_s(),
                        rows_per_s / 1e6
                    ));
                    ring_rows_per_s.push(rows_per_s);
                }
                Entry::Memcpy => {
                    let gbps = transports.measure_memcpy()?;
                    let rows_per_s = gbps * 1e9 / bytes_per_row;
                    progress(&format!(
                        "{label}: memcpy: {gbps:.2} GB/s, {:.3} M rows/s",
                        rows_per_s / 1e6
                    ));
                    memcpy_rows_per_s.push(rows_per_s);
                }
            }
        }
    }

    let (work_us, work_us_given) = match options.work_us {
        Some(work_us) => (work_us, true),
        None => (
            daemon_us_per_batch(
                throughput
                    .get(&System::Sluice)
                    .map_or(&[][..], Vec::as_slice),
            )?,
            false,
        ),
    };
    progress(&format!("work phase: {work_us:.1} µs of work per batch"));
    let mut working: BTreeMap<System, Vec<TrainerRun>> = BTreeMap::new();
    for round in 0..rounds {
        for offset in 0..systems.len() {
            let system = systems[(round + offset) % systems.len()];
            let run = runner.run(system, work_us, facts.rows)?;
            progress(&format!(
                "work round {}: {}: stall {:.2} %",
                round + 1,
                system.label(),
                run.stall_percent()
            ));
            working.entry(system).or_default().push(run);
        }
    }

    let figures_of = |system: System| -> Result<SystemFigures> {
        let measured =
            |runs: Option<&Vec<TrainerRun>>, figure: fn(&TrainerRun) -> f64, what: &str| {
                Spread::measured(
                    runs.map(|runs| runs.iter().map(figure).collect())
                        .unwrap_or_default(),
                    || format!("{what} of {}", system.label()),
                )
                .map(|spread| spread.median)
            };
        let fast = throughput.get(&system);
        let slow = working.get(&system);
        let rows_per_s = measured(fast, TrainerRun::rows_per_s, "rows/s")?;
        let cpu_s_per_mrows = measured(
            fast,
            |run| run.cpu_seconds / run.line.rows as f64 * 1e6,
            "CPU seconds per million rows",
        )?;
        let peak_rss = measured(fast, |run| run.peak_rss_bytes as f64, "peak RSS")?;
        Ok(SystemFigures {
            rows_per_s,
            gb_per_s: rows_per_s * bytes_per_row / 1e9,
            cpu_s_per_mrows: Some(cpu_s_per_mrows),
            stall_percent: Some(measured(slow, TrainerRun::stall_percent, "stall %")?),
            peak_rss_bytes: Some(peak_rss as u64),
            first_batch_s: Some(measured(
                slow,
                |run| run.line.first_batch_seconds,
                "seconds to the first batch",
            )?),
            rows: Some(facts.rows),
            num_workers: match system {
                System::DataLoader(workers) => Some(workers),
                _ => None,
            },
            ratio_to_sluice: 0.0,
        })
    };
    let limit = |samples: Vec<f64>, what: &str| -> Result<SystemFigures> {
        let rows_per_s = Spread::measured(samples, || format!("rows/s of {what}"))?.median;
        Ok(SystemFigures {
            rows_per_s,
            gb_per_s: rows_per_s * bytes_per_row / 1e9,
            cpu_s_per_mrows: None,
            stall_percent: None,
            peak_rss_bytes: None,
            first_batch_s: None,
            rows: None,
            num_workers: None,
            ratio_to_sluice: 0.0,
        })
    };
    let mut by_name = BTreeMap::new();
    let mut dataloaders = Vec::new();
    for &system in &systems {
        let figures = figures_of(system)?;
        match system {
            System::DataLoader(_) => dataloaders.push(figures),
            other => {
                by_name.insert(other.name().to_owned(), figures);
            }
        }
    }
    by_name.insert("ring".to_owned(), limit(ring_rows_per_s, "the ring")?);
    by_name.insert("memcpy".to_owned(), limit(memcpy_rows_per_s, "memcpy")?);
    let best_dataloader = dataloaders
        .iter()
        .max_by(|left, right| left.rows_per_s.total_cmp(&right.rows_per_s))
        .cloned()
        .ok_or_else(|| BenchError::Disagree {
            what: "pytorch_dataloader".to_owned(),
            detail: "no worker count was measured".to_owned(),
        })?;
    by_name.insert("pytorch_dataloader".to_owned(), best_dataloader);
    let sluice = by_name
        .get("sluice")
        .cloned()
        .ok_or_else(|| BenchError::Disagree {
            what: "sluice".to_owned(),
            detail: "not measured".to_owned(),
        })?;
    for figures in by_name.values_mut().chain(dataloaders.iter_mut()) {
        figures.ratio_to_sluice = figures.rows_per_s / sluice.rows_per_s;
    }
    let targets = Targets {
        sluice_over_dataloader: sluice.rows_per_s / by_name["pytorch_dataloader"].rows_per_s,
        sluice_over_pyarrow: sluice.rows_per_s / by_name["pyarrow"].rows_per_s,
        sluice_stall_percent: sluice.stall_percent.unwrap_or(f64::NAN),
    };
    Ok(SuiteReport {
        source: source.python.clone(),
        rows: facts.rows,
        arrow_bytes: facts.arrow_bytes,
        batch_rows: BATCH_ROWS,
        record_bytes,
        work_us,
        work_us_given,
        rounds,
        load_average_start,
        load_average_end: load_average(),
        systems: by_name,
        pytorch_dataloader_by_workers: dataloaders,
        not_installed,
        targets,
    })
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
}

impl DataSource {
    fn local(path: &Path) -> DataSource {
        DataSource {
            sluice_uri: format!("file://{}", path.display()),
            python: path.display().to_string(),
        }
    }

    /// The user's `--source`: a URI as it is, a path made absolute.
    fn given(source: &str) -> Result<DataSource> {
        if source.contains("://") {
            return Ok(DataSource {
                sluice_uri: source.to_owned(),
                python: source.to_owned(),
            });
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
    options: &'a SuiteOptions,
    script: &'a Path,
    work: &'a Path,
    source: &'a DataSource,
    task_rows: u64,
}

impl Runner<'_> {
    /// The trainer script's command for `system` with `work_us` of work per batch.
    fn trainer_arguments(&self, system: System, work_us: f64) -> Vec<String> {
        let mut arguments = vec![
            self.script.display().to_string(),
            system.name().to_owned(),
            "--source".to_owned(),
            self.source.python.clone(),
            "--batch-rows".to_owned(),
            BATCH_ROWS.to_string(),
            "--work-us".to_owned(),
            format!("{work_us:.3}"),
        ];
        if let System::DataLoader(workers) = system {
            arguments.extend(["--workers".to_owned(), workers.to_string()]);
        }
        if system == System::MosaicStreaming {
            let scratch = tempfile::Builder::new()
                .prefix("mds-")
                .tempdir_in(self.work)
                .map(tempfile::TempDir::keep)
                .unwrap_or_else(|_| self.work.join("mds"));
            arguments.extend([
                "--scratch".to_owned(),
                scratch.join("out").display().to_string(),
            ]);
        }
        arguments
    }

    /// Runs the trainer script with `arguments` and parses its JSON line.
    fn python_json<T: for<'de> Deserialize<'de>>(&self, arguments: &[&str]) -> Result<T> {
        let mut command = Command::new(&self.options.python);
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
    fn run(&self, system: System, work_us: f64, rows: u64) -> Result<TrainerRun> {
        let (command_line, line, samples) = if system.is_sluice() {
            self.run_sluice(system, work_us)?
        } else {
            let mut command = Command::new(&self.options.python);
            command.args(self.trainer_arguments(system, work_us));
            let (run, samples) = run_sampled(&mut command, RUN_TIMEOUT)?;
            let line = last_json_line(&run.stdout).map_err(|reason| BenchError::CommandOutput {
                command: display(&command),
                stdout: run.stdout.clone(),
                reason,
            })?;
            (display(&command), line, samples)
        };
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
        let daemon_cpu_seconds =
            samples.cpu_seconds_between(line.window_start_ns, line.window_end_ns, is_sluice_daemon);
        Ok(TrainerRun {
            cpu_seconds,
            daemon_cpu_seconds,
            peak_rss_bytes: samples.peak_rss_sum(),
            line,
        })
    }

    /// Runs a Sluice job whose one trainer runs `system`: `sluice am`, then the trainer, then, once the
    /// trainer has imported everything and started its clock, `sluice daemon`.
    fn run_sluice(
        &self,
        system: System,
        work_us: f64,
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
        let mut trainer_command = vec![self.options.python.to_string_lossy().into_owned()];
        trainer_command.extend(self.trainer_arguments(system, work_us));
        std::fs::write(
            &spec,
            job_spec(&self.source.sluice_uri, self.task_rows, &trainer_command),
        )
        .map_err(|source| BenchError::Setup {
            operation: format!("writing {}", spec.display()),
            source,
        })?;

        let mut am_command = Command::new(&self.options.sluice);
        am_command
            .arg("am")
            .arg(&spec)
            .args(["--listen", "127.0.0.1:0"])
            .env_remove("SLUICE_TOKEN");
        let mut am = Service::spawn(&mut am_command, directory.path().join("am.log"))?;
        let sampler = TreeSampler::start(am.child.id());
        let address = am
            .wait_for_line(|line| line.contains(" serving on "), SERVICE_START_TIMEOUT)?
            .trim()
            .rsplit(' ')
            .next()
            .unwrap_or_default()
            .to_owned();

        let mut trainer = Command::new(&self.options.python);
        trainer
            .args(self.trainer_arguments(system, work_us))
            .env("SLUICE_RING", rings.join(JOB_NAME).join("0.ring"))
            .env("SLUICE_AM", &address)
            .env("SLUICE_RANK", "0")
            .env("SLUICE_WORLD_SIZE", "1")
            .env_remove("SLUICE_TOKEN");
        let shown = display(&trainer);
        let mut trainer = Service::spawn(&mut trainer, directory.path().join("trainer.log"))?;
        sampler.add_root(trainer.child.id());
        trainer.wait_for_line(|line| line.trim() == "ready", SERVICE_START_TIMEOUT)?;

        let mut daemon_command = Command::new(&self.options.sluice);
        daemon_command
            .arg("daemon")
            .args(["--am", &address])
            .arg("--ring-dir")
            .arg(rings)
            .env_remove("SLUICE_TOKEN");
        let mut daemon = Service::spawn(&mut daemon_command, directory.path().join("daemon.log"))?;
        sampler.add_root(daemon.child.id());

        let stdout = trainer.finish(RUN_TIMEOUT)?;
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

/// The job spec of the Sluice systems: one daemon, one trainer, all the data. `sluice am` launches no
/// executor; the role's command records what the suite starts as the trainer.
fn job_spec(uri: &str, task_rows: u64, trainer: &[String]) -> String {
    let command = serde_json::to_string(trainer).unwrap_or_default();
    format!(
        r#"name: {JOB_NAME}
data:
  sources: [{{ uri: {uri}, format: parquet }}]
  batch_size: {BATCH_ROWS}
  task_rows: {task_rows}
nodes: 1
roles:
  - {{ name: worker, num: 1, command: {command} }}
failover: {{ restart: never }}
"#,
        uri = serde_json::to_string(uri).unwrap_or_default(),
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
        for name in ["sluice", "sluice_torch"] {
            if let Some(figures) = self.systems.get(name) {
                rows.push((name.to_owned(), figures));
            }
        }
        for figures in &self.pytorch_dataloader_by_workers {
            let workers = figures.num_workers.unwrap_or_default();
            let best = self
                .systems
                .get("pytorch_dataloader")
                .is_some_and(|best| best.num_workers == Some(workers));
            rows.push((
                format!(
                    "pytorch_dataloader ({workers} worker{}){}",
                    if workers == 1 { "" } else { "s" },
                    if best { " *" } else { "" }
                ),
                figures,
            ));
        }
        for name in ["pyarrow", "mosaic_streaming", "ray_data", "ring", "memcpy"] {
            if let Some(figures) = self.systems.get(name) {
                rows.push((name.to_owned(), figures));
            }
        }
        rows
    }

    /// The bars of the chart: rows/s per row of the table.
    pub fn chart_bars(&self) -> Vec<(String, f64)> {
        self.rows()
            .into_iter()
            .map(|(label, figures)| {
                (
                    label
                        .replace("pytorch_dataloader (", "DataLoader ")
                        .replace(" workers)", "w")
                        .replace(" worker)", "w"),
                    figures.rows_per_s,
                )
            })
            .collect()
    }

    /// The chart's title.
    pub fn chart_title(&self) -> String {
        format!(
            "rows/s to one trainer, {} rows in batches of {}",
            self.rows, self.batch_rows
        )
    }

    /// The report as a table for people.
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        let optional = |value: Option<f64>, precision: usize| {
            value.map_or_else(|| "-".to_owned(), |value| format!("{value:.precision$}"))
        };
        // Writing to a String cannot fail.
        writeln!(
            out,
            "sluice bench suite: {} rows of {} ({:.1} MB as Arrow, {:.1} B/row) in batches of {} ({} B as Arrow IPC); median of {} round(s); work phase {:.1} µs per batch ({}); load average {} at start, {} at end",
            self.rows,
            self.source,
            self.arrow_bytes as f64 / 1e6,
            self.arrow_bytes as f64 / self.rows as f64,
            self.batch_rows,
            self.record_bytes,
            self.rounds,
            self.work_us,
            if self.work_us_given {
                "--work-us"
            } else {
                "the daemon's CPU per batch"
            },
            format_load(self.load_average_start),
            format_load(self.load_average_end),
        )
        .ok();
        writeln!(
            out,
            "{:<34} {:>10} {:>7} {:>12} {:>8} {:>8} {:>10} {:>9}",
            "system", "M rows/s", "GB/s", "CPU s/Mrows", "stall %", "1st s", "peak RSS", "÷ sluice"
        )
        .ok();
        for (label, figures) in self.rows() {
            writeln!(
                out,
                "{:<34} {:>10.3} {:>7.3} {:>12} {:>8} {:>8} {:>10} {:>8.3}x",
                label,
                figures.rows_per_s / 1e6,
                figures.gb_per_s,
                optional(figures.cpu_s_per_mrows, 2),
                optional(figures.stall_percent, 2),
                optional(figures.first_batch_s, 2),
                figures.peak_rss_bytes.map_or_else(
                    || "-".to_owned(),
                    |bytes| format!("{:.0} MB", bytes as f64 / 1e6)
                ),
                figures.ratio_to_sluice,
            )
            .ok();
        }
        for name in &self.not_installed {
            writeln!(out, "{name:<34} not installed").ok();
        }
        writeln!(
            out,
            "* the best DataLoader worker count, the pytorch_dataloader figure"
        )
        .ok();
        let verdict = |met: bool| if met { "met" } else { "NOT met" };
        let targets = &self.targets;
        writeln!(
            out,
            "targets: sluice ÷ pytorch_dataloader {:.2}x (≥ {}: {}); sluice ÷ pyarrow {:.2}x (≥ {}: {}); sluice stall {:.2} % (< {} %: {})",
            targets.sluice_over_dataloader,
            Targets::DATALOADER,
            verdict(targets.sluice_over_dataloader >= Targets::DATALOADER),
            targets.sluice_over_pyarrow,
            Targets::PYARROW,
            verdict(targets.sluice_over_pyarrow >= Targets::PYARROW),
            targets.sluice_stall_percent,
            Targets::STALL_PERCENT,
            verdict(targets.sluice_stall_percent < Targets::STALL_PERCENT),
        )
        .ok();
        out
    }
}

#[cfg(test)]
mod tests {
    use sluice_am::spec::{Format, JobSpec};

    use super::*;

    #[test]
    fn the_job_runs_the_trainer_script_as_its_one_trainer() {
        let trainer = [
            "python3".to_owned(),
            "/tmp/w/suite_trainer.py".to_owned(),
            "sluice".to_owned(),
            "--work-us".to_owned(),
            "12.5".to_owned(),
        ];
        let spec = job_spec("file:///data/suite dir", 1 << 15, &trainer);
        let job = JobSpec::parse(&spec, Format::Yaml).expect("a valid job spec");
        assert_eq!(job.nodes, 1);
        assert_eq!(job.roles.len(), 1);
        assert_eq!(job.roles[0].num, 1);
        assert_eq!(job.roles[0].command, trainer);
        assert_eq!(job.data.batch_size as usize, BATCH_ROWS);
        assert_eq!(job.data.sources[0].uri, "file:///data/suite dir");
    }

    #[test]
    fn stall_leaves_out_the_wait_for_the_first_batch() {
        let sut = TrainerRun {
            line: TrainerLine {
                rows: 100,
                batches: 10,
                seconds: 3.0,
                first_batch_seconds: 1.0,
                wait_seconds: 0.5,
                window_start_ns: 0,
                window_end_ns: 3_000_000_000,
            },
            cpu_seconds: 1.0,
            daemon_cpu_seconds: 0.2,
            peak_rss_bytes: 1,
        };
        assert_eq!(sut.stall_percent(), 25.0);
        assert!((sut.rows_per_s() - 100.0 / 3.0).abs() < 1e-9);
        let per_batch = daemon_us_per_batch(std::slice::from_ref(&sut)).expect("measured");
        assert!((per_batch - 20_000.0).abs() < 1e-6, "{per_batch}");
    }

    #[test]
    fn a_daemon_that_used_no_cpu_asks_for_work_us() {
        let sut = TrainerRun {
            line: TrainerLine {
                rows: 1,
                batches: 1,
                seconds: 1.0,
                first_batch_seconds: 0.5,
                wait_seconds: 0.0,
                window_start_ns: 0,
                window_end_ns: 1,
            },
            cpu_seconds: 1.0,
            daemon_cpu_seconds: 0.0,
            peak_rss_bytes: 1,
        };
        let error = daemon_us_per_batch(&[sut]).expect_err("no daemon CPU");
        assert!(error.to_string().contains("--work-us"), "{error}");
    }

    #[test]
    fn the_daemon_is_told_from_the_am_and_the_trainer_by_the_subcommand() {
        let process = |arguments: &[&str]| TreeProcess {
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
    fn a_missing_source_names_the_fix() {
        let error = DataSource::given("/nonexistent/sluice-suite-data").expect_err("missing");
        assert!(error.to_string().contains("--source"), "{error}");
        let uri = DataSource::given("s3://bucket/train").expect("a URI is taken as it is");
        assert_eq!(uri.sluice_uri, "s3://bucket/train");
    }
}

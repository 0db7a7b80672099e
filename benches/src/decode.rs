//! `sluice-bench decode`: Parquet decode on one core, Sluice against pyarrow, and Sluice on two cores.
//!
//! The file is the training-like file of [`crate::training_data`], about 1 GiB once decoded, written once
//! with snappy and once with zstd into a cache directory and reused by later runs. For each codec the
//! benchmark first runs every side once untimed (to warm the page cache and to check that the sides agree
//! on the row count and every column's null count), then runs rounds in which the sides take turns:
//!
//! - `sluice 1 core`: `taskset -c 0 sluice read FILE --stats --threads 1`, the command a data engineer runs,
//!   timed from spawn to exit, so process start, opening the file and planning count against Sluice;
//! - `pyarrow 1 core`: `taskset -c 0 python3 -c ...` timing `pq.read_table(path, use_threads=False)` inside
//!   the script, without the interpreter's start or the import;
//! - `sluice 2 cores`: `sluice read FILE --stats --threads 2`, unpinned;
//! - `2 × sluice 1 core`: two `sluice 1 core` processes started together, one pinned to each core, each
//!   decoding the whole file; rows per second count both files' rows up to the slower one's exit. Two
//!   independent processes share nothing but the machine, so this is what two cores of this host give a
//!   decode that needs no coordination: the ceiling for `sluice 2 cores`, measured in the same round.
//!
//! The order of the sides rotates from one round to the next, so that neither always runs right after the
//! other on a shared, noisy machine. Figures are rows per second; the report gives the median and the range
//! over the rounds, and the ratios of the medians.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::command::{Spread, check_pyarrow, check_taskset, display, load_average, run_timed};
use crate::error::{BenchError, Result};
use crate::training_data::{Codec, PyarrowComparison};

/// The core both one-core sides are pinned to.
pub const PINNED_CPU: usize = 0;
/// The cores of the two processes of the side-by-side side.
pub const SIDE_BY_SIDE_CPUS: [usize; 2] = [PINNED_CPU, 1];
/// The longest one decode may take before it is killed.
const DECODE_TIMEOUT: Duration = Duration::from_secs(600);

/// The pyarrow side: reads the file given as the first argument once and prints one JSON line.
const PYARROW_SCRIPT: &str = r#"
import json, sys, time
import pyarrow.parquet as pq

start = time.perf_counter()
table = pq.read_table(sys.argv[1], use_threads=False)
seconds = time.perf_counter() - start
print(json.dumps({
    "rows": table.num_rows,
    "seconds": seconds,
    "decoded_bytes": table.nbytes,
    "null_counts": {name: table.column(name).null_count for name in table.column_names},
}))
"#;

/// The four measured sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    SluiceOneCore,
    PyarrowOneCore,
    SluiceTwoCores,
    SluiceTwoProcesses,
}

impl Side {
    const ALL: [Side; 4] = [
        Side::SluiceOneCore,
        Side::PyarrowOneCore,
        Side::SluiceTwoCores,
        Side::SluiceTwoProcesses,
    ];

    fn name(self) -> &'static str {
        match self {
            Side::SluiceOneCore => "sluice 1 core",
            Side::PyarrowOneCore => "pyarrow 1 core",
            Side::SluiceTwoCores => "sluice 2 cores",
            Side::SluiceTwoProcesses => "2 x sluice 1 core",
        }
    }

    /// The processes of this side, started together.
    fn commands(self, options: &PyarrowComparison, path: &Path) -> Vec<Command> {
        let pinned_sluice = |cpu: usize| {
            let mut command = Command::new("taskset");
            command
                .args(["-c", &cpu.to_string()])
                .arg(&options.sluice)
                .arg("read")
                .arg(path)
                .args(["--stats", "--threads", "1"]);
            command
        };
        match self {
            Side::SluiceOneCore => vec![pinned_sluice(PINNED_CPU)],
            Side::SluiceTwoProcesses => SIDE_BY_SIDE_CPUS.map(pinned_sluice).into(),
            Side::PyarrowOneCore => {
                let mut command = Command::new("taskset");
                command
                    .args(["-c", &PINNED_CPU.to_string()])
                    .arg(&options.python)
                    .args(["-c", PYARROW_SCRIPT])
                    .arg(path);
                vec![command]
            }
            Side::SluiceTwoCores => {
                let mut command = Command::new(&options.sluice);
                command
                    .arg("read")
                    .arg(path)
                    .args(["--stats", "--threads", "2"]);
                vec![command]
            }
        }
    }

    /// Runs this side once: the rows one of its processes decoded, their null counts, and the time until
    /// the last process exited (or the time pyarrow measured).
    ///
    /// The processes of a side must agree with each other; rows per second are [`Decoded::rows_per_second`].
    fn run(self, options: &PyarrowComparison, path: &Path) -> Result<Decoded> {
        let mut commands = self.commands(options, path);
        let runs: Vec<Result<Decoded>> = std::thread::scope(|scope| {
            let handles: Vec<_> = commands
                .iter_mut()
                .map(|command| scope.spawn(move || self.run_one(command)))
                .collect();
            handles
                .into_iter()
                .map(|handle| {
                    handle.join().unwrap_or_else(|_| {
                        Err(BenchError::Disagree {
                            what: format!("timing {}", self.name()),
                            detail: "the thread running a process panicked".to_owned(),
                        })
                    })
                })
                .collect()
        });
        let mut decoded: Option<Decoded> = None;
        for run in runs {
            let run = run?;
            match &mut decoded {
                None => decoded = Some(run),
                Some(first) => {
                    agree(path, self, &run, first)?;
                    first.seconds = first.seconds.max(run.seconds);
                    first.processes += 1;
                }
            }
        }
        decoded.ok_or_else(|| BenchError::Disagree {
            what: format!("timing {}", self.name()),
            detail: "the side started no process".to_owned(),
        })
    }

    /// Runs one process of this side: the rows it decoded, their null counts, and the time to count.
    fn run_one(self, command: &mut Command) -> Result<Decoded> {
        let run = run_timed(command, DECODE_TIMEOUT)?;
        let unusable = |reason: String| BenchError::CommandOutput {
            command: display(command),
            stdout: run.stdout.clone(),
            reason,
        };
        match self {
            Side::SluiceOneCore | Side::SluiceTwoCores | Side::SluiceTwoProcesses => {
                let stats: SluiceStats =
                    serde_json::from_str(run.stdout.trim()).map_err(|error| {
                        unusable(format!("not the JSON of `read --stats`: {error}"))
                    })?;
                Ok(Decoded {
                    rows: stats.rows,
                    null_counts: stats.null_counts,
                    seconds: run.elapsed.as_secs_f64(),
                    decoded_bytes: None,
                    processes: 1,
                })
            }
            Side::PyarrowOneCore => {
                let report: PyarrowReport = serde_json::from_str(run.stdout.trim())
                    .map_err(|error| unusable(format!("not the pyarrow script's JSON: {error}")))?;
                if !(report.seconds.is_finite() && report.seconds > 0.0) {
                    return Err(unusable(format!(
                        "{} seconds is not a duration",
                        report.seconds
                    )));
                }
                Ok(Decoded {
                    rows: report.rows,
                    null_counts: report.null_counts,
                    seconds: report.seconds,
                    decoded_bytes: Some(report.decoded_bytes),
                    processes: 1,
                })
            }
        }
    }
}

/// The JSON line of `sluice read --stats`.
#[derive(Debug, Deserialize)]
struct SluiceStats {
    rows: u64,
    null_counts: BTreeMap<String, u64>,
}

/// The JSON line of [`PYARROW_SCRIPT`].
#[derive(Debug, Deserialize)]
struct PyarrowReport {
    rows: u64,
    seconds: f64,
    decoded_bytes: u64,
    null_counts: BTreeMap<String, u64>,
}

/// One decode of the whole file by each process of one side.
#[derive(Debug, Clone, PartialEq)]
struct Decoded {
    /// Rows of one process (each decodes the whole file).
    rows: u64,
    null_counts: BTreeMap<String, u64>,
    /// Until the last process exited.
    seconds: f64,
    decoded_bytes: Option<u64>,
    /// How many processes decoded the file side by side.
    processes: u32,
}

impl Decoded {
    /// The rows of all processes over the time until the last one exited.
    fn rows_per_second(&self) -> f64 {
        f64::from(self.processes) * self.rows as f64 / self.seconds
    }
}

/// Checks that a side decoded what the reference side decoded.
fn agree(file: &Path, side: Side, decoded: &Decoded, reference: &Decoded) -> Result<()> {
    let what = || format!("decoding {} ({})", file.display(), side.name());
    if decoded.rows != reference.rows {
        return Err(BenchError::Disagree {
            what: what(),
            detail: format!(
                "{} rows, the other side {} rows",
                decoded.rows, reference.rows
            ),
        });
    }
    if decoded.null_counts != reference.null_counts {
        return Err(BenchError::Disagree {
            what: what(),
            detail: format!(
                "null counts {:?}, the other side {:?}",
                decoded.null_counts, reference.null_counts
            ),
        });
    }
    Ok(())
}

/// The figures of one codec's file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CodecReport {
    /// The compression codec of the file.
    pub codec: Codec,
    /// The file's path.
    pub file: String,
    /// The file's size in bytes.
    pub file_bytes: u64,
    /// Rows in the file.
    pub rows: u64,
    /// The bytes of the decoded table, as pyarrow counts them (`Table.nbytes`).
    pub decoded_bytes: u64,
    /// Sluice, one thread, pinned to one core: rows per second.
    pub sluice_one_core: Spread,
    /// pyarrow, `use_threads=False`, pinned to the same core: rows per second.
    pub pyarrow_one_core: Spread,
    /// Sluice, two threads, unpinned: rows per second.
    pub sluice_two_cores: Spread,
    /// Two one-thread Sluice processes, one pinned to each core: the rows of both per second.
    pub side_by_side: Spread,
    /// Median Sluice one-core rows/s over median pyarrow one-core rows/s.
    pub ratio_to_pyarrow: f64,
    /// Median Sluice two-core rows/s over median Sluice one-core rows/s.
    pub two_cores_over_one: f64,
    /// Median side-by-side rows/s over median Sluice one-core rows/s: what two cores of this host give
    /// two decodes that share nothing.
    pub side_by_side_over_one: f64,
    /// Median Sluice two-core rows/s over median side-by-side rows/s: the share of that ceiling one
    /// process with two threads reaches.
    pub two_cores_over_side_by_side: f64,
}

/// Everything one `sluice-bench decode` run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeBenchReport {
    /// Rounds per codec.
    pub rounds: usize,
    /// The core the one-core sides were pinned to.
    pub cpu: usize,
    /// The 1-minute load average when the run started.
    pub load_average_start: Option<f64>,
    /// The 1-minute load average when the run ended.
    pub load_average_end: Option<f64>,
    /// One entry per codec.
    pub codecs: Vec<CodecReport>,
}

/// Runs the decode benchmark; `progress` receives one line per finished run.
///
/// # Errors
///
/// Returns an error when taskset or pyarrow is missing, the file cannot be written, a side fails, or the
/// sides disagree on what the file holds.
pub fn run_decode_bench(
    options: &PyarrowComparison,
    progress: &mut dyn FnMut(&str),
) -> Result<DecodeBenchReport> {
    if options.rounds == 0 {
        return Err(BenchError::InvalidOption {
            option: "--rounds".to_owned(),
            reason: "0 rounds measure nothing; give at least 1".to_owned(),
        });
    }
    check_taskset(&SIDE_BY_SIDE_CPUS)?;
    check_pyarrow(&options.python)?;
    let load_average_start = load_average();
    let rounds = if options.quick { 1 } else { options.rounds };
    let mut codecs = Vec::with_capacity(Codec::ALL.len());
    for codec in Codec::ALL {
        let path = options.file().ensure(&options.cache_dir, codec)?;
        let file_bytes = std::fs::metadata(&path)
            .map_err(|source| BenchError::Setup {
                operation: format!("reading the size of {}", path.display()),
                source,
            })?
            .len();
        progress(&format!(
            "{}: {} ({:.1} MiB)",
            codec.name(),
            path.display(),
            file_bytes as f64 / f64::from(1 << 20)
        ));
        let reference = Side::PyarrowOneCore.run(options, &path)?;
        for side in [
            Side::SluiceOneCore,
            Side::SluiceTwoCores,
            Side::SluiceTwoProcesses,
        ] {
            agree(&path, side, &side.run(options, &path)?, &reference)?;
        }
        let mut samples: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for round in 0..rounds {
            for offset in 0..Side::ALL.len() {
                let side = Side::ALL[(round + offset) % Side::ALL.len()];
                let decoded = side.run(options, &path)?;
                agree(&path, side, &decoded, &reference)?;
                let rows_per_s = decoded.rows_per_second();
                progress(&format!(
                    "{} round {}: {}: {:.3} s, {:.2} M rows/s",
                    codec.name(),
                    round + 1,
                    side.name(),
                    decoded.seconds,
                    rows_per_s / 1e6
                ));
                samples.entry(side.name()).or_default().push(rows_per_s);
            }
        }
        let mut spread = |side: Side| {
            Spread::measured(samples.remove(side.name()).unwrap_or_default(), || {
                format!("{} timings of {}", side.name(), path.display())
            })
        };
        let sluice_one_core = spread(Side::SluiceOneCore)?;
        let pyarrow_one_core = spread(Side::PyarrowOneCore)?;
        let sluice_two_cores = spread(Side::SluiceTwoCores)?;
        let side_by_side = spread(Side::SluiceTwoProcesses)?;
        codecs.push(CodecReport {
            codec,
            file: path.display().to_string(),
            file_bytes,
            rows: reference.rows,
            decoded_bytes: reference.decoded_bytes.unwrap_or(0),
            ratio_to_pyarrow: sluice_one_core.median / pyarrow_one_core.median,
            two_cores_over_one: sluice_two_cores.median / sluice_one_core.median,
            side_by_side_over_one: side_by_side.median / sluice_one_core.median,
            two_cores_over_side_by_side: sluice_two_cores.median / side_by_side.median,
            sluice_one_core,
            pyarrow_one_core,
            sluice_two_cores,
            side_by_side,
        });
    }
    Ok(DecodeBenchReport {
        rounds,
        cpu: PINNED_CPU,
        load_average_start,
        load_average_end: load_average(),
        codecs,
    })
}

impl DecodeBenchReport {
    /// The report as one JSON object.
    ///
    /// # Errors
    ///
    /// Returns serde's error, which a report of finite numbers never produces.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string(self)
    }

    /// The report as a table for people.
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        let load = crate::command::format_load;
        // Writing to a String cannot fail.
        writeln!(
            out,
            "Parquet decode, rows/s: median of {} round(s) [min..max]; one-core sides on cpu {}; load average {} at start, {} at end",
            self.rounds,
            self.cpu,
            load(self.load_average_start),
            load(self.load_average_end)
        )
        .ok();
        let rate = |spread: &Spread| {
            format!(
                "{:.2} M [{:.2}..{:.2}]",
                spread.median / 1e6,
                spread.min / 1e6,
                spread.max / 1e6
            )
        };
        writeln!(
            out,
            "{:<7} {:>9} {:>11} {:>24} {:>24} {:>9} {:>24} {:>9} {:>24} {:>9} {:>11}",
            "codec",
            "file MiB",
            "decoded GiB",
            "sluice 1 core",
            "pyarrow 1 core",
            "ratio",
            "sluice 2 cores",
            "2c / 1c",
            "2 x sluice 1 core",
            "2x1 / 1c",
            "2c / (2x1)"
        )
        .ok();
        for codec in &self.codecs {
            writeln!(
                out,
                "{:<7} {:>9.1} {:>11.2} {:>24} {:>24} {:>8.2}x {:>24} {:>8.2}x {:>24} {:>8.2}x {:>10.2}x",
                codec.codec.name(),
                codec.file_bytes as f64 / f64::from(1 << 20),
                codec.decoded_bytes as f64 / f64::from(1 << 30),
                rate(&codec.sluice_one_core),
                rate(&codec.pyarrow_one_core),
                codec.ratio_to_pyarrow,
                rate(&codec.sluice_two_cores),
                codec.two_cores_over_one,
                rate(&codec.side_by_side),
                codec.side_by_side_over_one,
                codec.two_cores_over_side_by_side
            )
            .ok();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::path::PathBuf;

    use super::*;

    fn decoded(rows: u64, nulls: &[(&str, u64)]) -> Decoded {
        Decoded {
            rows,
            null_counts: nulls
                .iter()
                .map(|(name, count)| ((*name).to_owned(), *count))
                .collect(),
            seconds: 1.0,
            decoded_bytes: None,
            processes: 1,
        }
    }

    #[test]
    fn sides_that_decode_different_rows_or_nulls_are_not_compared() {
        let reference = decoded(10, &[("a", 1), ("b", 0)]);
        let file = Path::new("f.parquet");
        agree(file, Side::SluiceOneCore, &reference, &reference).expect("same");
        let error = agree(
            file,
            Side::SluiceOneCore,
            &decoded(9, &[("a", 1), ("b", 0)]),
            &reference,
        )
        .expect_err("rows differ");
        assert!(error.to_string().contains("9 rows"), "{error}");
        let error = agree(
            file,
            Side::SluiceTwoCores,
            &decoded(10, &[("a", 2), ("b", 0)]),
            &reference,
        )
        .expect_err("nulls differ");
        assert!(
            error.to_string().contains("null counts") && error.to_string().contains("2 cores"),
            "{error}"
        );
    }

    fn shown(side: Side, options: &PyarrowComparison, file: &Path) -> Vec<String> {
        side.commands(options, file).iter().map(display).collect()
    }

    #[test]
    fn side_by_side_counts_the_rows_of_both_processes_until_the_slower_exits() {
        let mut both = decoded(1_000, &[]);
        both.seconds = 4.0;
        both.processes = 2;
        assert!((both.rows_per_second() - 500.0).abs() < 1e-9);
        assert!((decoded(1_000, &[]).rows_per_second() - 1_000.0).abs() < 1e-9);
    }

    #[test]
    fn one_core_sides_run_under_taskset_and_two_cores_do_not() {
        let options = PyarrowComparison {
            sluice: PathBuf::from("/bin/sluice"),
            python: OsString::from("python3"),
            cache_dir: PathBuf::from("/tmp"),
            quick: true,
            rounds: 1,
        };
        let file = Path::new("/data/f.parquet");
        assert_eq!(
            shown(Side::SluiceOneCore, &options, file),
            ["taskset -c 0 /bin/sluice read /data/f.parquet --stats --threads 1"]
        );
        let pyarrow = shown(Side::PyarrowOneCore, &options, file);
        assert_eq!(pyarrow.len(), 1);
        assert!(pyarrow[0].starts_with("taskset -c 0 python3 -c"));
        assert_eq!(
            shown(Side::SluiceTwoCores, &options, file),
            ["/bin/sluice read /data/f.parquet --stats --threads 2"]
        );
        assert_eq!(
            shown(Side::SluiceTwoProcesses, &options, file),
            [
                "taskset -c 0 /bin/sluice read /data/f.parquet --stats --threads 1",
                "taskset -c 1 /bin/sluice read /data/f.parquet --stats --threads 1"
            ]
        );
    }
}

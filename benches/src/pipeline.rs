//! `sluice-bench pipeline`: rows per second delivered to one trainer by the whole Sluice pipeline, against
//! a bare pyarrow scan of the same file in the trainer's own process.
//!
//! The file is the training-like, snappy-compressed file of [`crate::training_data`] (the one
//! `sluice-bench decode` uses). The two sides take turns, in an order that rotates from one round to the
//! next:
//!
//! - `sluice`: `sluice run JOB` with the AM, one node daemon and one reference trainer
//!   (`sluice consume`) as separate processes on this machine, unpinned. The figure is the trainer's own:
//!   rows it received over the time from opening its ring to the end of the data, so the AM's start and
//!   the launch of the processes do not count, but the daemon's task acquisition, fetch, decode, ring
//!   write and the trainer's read do.
//! - `pyarrow`: `pyarrow.dataset` scanning the file to record batches of the same size, with its default
//!   threads, timed inside the script (without the interpreter's start or the import).
//!
//! Both sides must see the same number of rows. The report gives the median and the range of rows/s over
//! the rounds, and the ratio of the medians.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::command::{Spread, check_pyarrow, display, format_load, load_average, run_timed};
use crate::error::{BenchError, Result};
use crate::training_data::{Codec, PyarrowComparison};

/// The longest one side may take before it is killed.
const SIDE_TIMEOUT: Duration = Duration::from_secs(600);
/// Rows per batch on both sides, a common training batch.
pub const BATCH_ROWS: usize = 4096;
/// Rows per task of the Sluice job.
pub const TASK_ROWS: u64 = 1 << 18;

/// The pyarrow side: scans the file given as the first argument once and prints one JSON line.
const PYARROW_SCRIPT: &str = r#"
import json, sys, time
import pyarrow.dataset as ds

start = time.perf_counter()
rows = 0
for batch in ds.dataset(sys.argv[1], format="parquet").to_batches(batch_size=int(sys.argv[2])):
    rows += batch.num_rows
seconds = time.perf_counter() - start
print(json.dumps({"rows": rows, "seconds": seconds}))
"#;

/// The two measured sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Sluice,
    Pyarrow,
}

impl Side {
    const ALL: [Side; 2] = [Side::Sluice, Side::Pyarrow];

    fn name(self) -> &'static str {
        match self {
            Side::Sluice => "sluice",
            Side::Pyarrow => "pyarrow",
        }
    }
}

/// The JSON line `sluice consume` and the pyarrow script print.
#[derive(Debug, Deserialize)]
struct Delivered {
    rows: u64,
    seconds: f64,
}

/// The job spec of the Sluice side: one daemon, one trainer, the whole file.
fn job_spec(sluice: &Path, file: &Path) -> String {
    format!(
        r#"name: bench-pipeline
data:
  sources: [{{ uri: "file://{file}", format: parquet }}]
  batch_size: {BATCH_ROWS}
  task_rows: {TASK_ROWS}
nodes: 1
roles:
  - {{ name: worker, num: 1, command: ["{sluice}", consume] }}
failover: {{ restart: never }}
"#,
        file = file.display(),
        sluice = sluice.display(),
    )
}

/// Runs the Sluice side once in `work`.
fn run_sluice(options: &PyarrowComparison, file: &Path, work: &Path) -> Result<Delivered> {
    let spec = work.join("job.yaml");
    let state = work.join("state");
    let setup = |operation: String| {
        move |source| BenchError::Setup {
            operation: operation.clone(),
            source,
        }
    };
    std::fs::write(&spec, job_spec(&options.sluice, file))
        .map_err(setup(format!("writing {}", spec.display())))?;
    if state.exists() {
        std::fs::remove_dir_all(&state).map_err(setup(format!("clearing {}", state.display())))?;
    }
    let mut command = Command::new(&options.sluice);
    command
        .arg("run")
        .arg(&spec)
        .arg("--ring-dir")
        .arg(work.join("rings"))
        .arg("--state-dir")
        .arg(&state);
    let run = run_timed(&mut command, SIDE_TIMEOUT)?;
    let log = state.join("trainer-worker-0.log");
    let text = std::fs::read_to_string(&log).map_err(setup(format!(
        "reading the trainer's log {}",
        log.display()
    )))?;
    let line = text
        .lines()
        .rev()
        .find(|line| line.starts_with('{'))
        .unwrap_or_default();
    serde_json::from_str(line).map_err(|error| BenchError::CommandOutput {
        command: display(&command),
        stdout: format!("{}\n--- {}\n{text}", run.stdout, log.display()),
        reason: format!("the trainer's log ends without the JSON of `sluice consume`: {error}"),
    })
}

/// Runs the pyarrow side once.
fn run_pyarrow(options: &PyarrowComparison, file: &Path) -> Result<Delivered> {
    let mut command = Command::new(&options.python);
    command
        .args(["-c", PYARROW_SCRIPT])
        .arg(file)
        .arg(BATCH_ROWS.to_string());
    let run = run_timed(&mut command, SIDE_TIMEOUT)?;
    serde_json::from_str(run.stdout.trim()).map_err(|error| BenchError::CommandOutput {
        command: display(&command),
        stdout: run.stdout.clone(),
        reason: format!("not the pyarrow script's JSON: {error}"),
    })
}

/// Everything one `sluice-bench pipeline` run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PipelineBenchReport {
    /// The file both sides read.
    pub file: String,
    /// Rows in the file.
    pub rows: u64,
    /// Rows per batch on both sides.
    pub batch_rows: usize,
    /// Rounds of the two sides.
    pub rounds: usize,
    /// The 1-minute load average when the run started.
    pub load_average_start: Option<f64>,
    /// The 1-minute load average when the run ended.
    pub load_average_end: Option<f64>,
    /// Rows per second the trainer received through Sluice.
    pub sluice: Spread,
    /// Rows per second of the in-process pyarrow scan.
    pub pyarrow: Spread,
    /// Median Sluice rows/s over median pyarrow rows/s.
    pub ratio_to_pyarrow: f64,
}

/// Runs the pipeline benchmark; `progress` receives one line per finished run.
///
/// # Errors
///
/// Returns an error when pyarrow is missing, the file cannot be written, a side fails, or the sides
/// disagree on the number of rows.
pub fn run_pipeline_bench(
    options: &PyarrowComparison,
    progress: &mut dyn FnMut(&str),
) -> Result<PipelineBenchReport> {
    if options.rounds == 0 {
        return Err(BenchError::InvalidOption {
            option: "--rounds".to_owned(),
            reason: "0 rounds measure nothing; give at least 1".to_owned(),
        });
    }
    check_pyarrow(&options.python)?;
    let load_average_start = load_average();
    let rounds = if options.quick { 1 } else { options.rounds };
    let training_file = options.file();
    let file = training_file.ensure(&options.cache_dir, Codec::Snappy)?;
    let work = tempfile::tempdir().map_err(|source| BenchError::Setup {
        operation: "creating a directory for the job's rings and logs".to_owned(),
        source,
    })?;
    progress(&format!("file: {}", file.display()));
    let run = |side: Side| match side {
        Side::Sluice => run_sluice(options, &file, work.path()),
        Side::Pyarrow => run_pyarrow(options, &file),
    };
    let rows = training_file.rows;
    let mut samples: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    // One untimed run of each side warms the page cache and checks that both see every row.
    for round in 0..=rounds {
        for offset in 0..Side::ALL.len() {
            let side = Side::ALL[(round + offset) % Side::ALL.len()];
            let delivered = run(side)?;
            if delivered.rows != rows {
                return Err(BenchError::Disagree {
                    what: format!("rows of {} ({})", file.display(), side.name()),
                    detail: format!("{} rows delivered, the file has {rows}", delivered.rows),
                });
            }
            let rows_per_s = delivered.rows as f64 / delivered.seconds;
            let label = if round == 0 {
                "warm-up".to_owned()
            } else {
                format!("round {round}")
            };
            progress(&format!(
                "{label}: {}: {:.3} s, {:.2} M rows/s",
                side.name(),
                delivered.seconds,
                rows_per_s / 1e6
            ));
            if round > 0 {
                samples.entry(side.name()).or_default().push(rows_per_s);
            }
        }
    }
    let mut spread = |side: Side| {
        Spread::measured(samples.remove(side.name()).unwrap_or_default(), || {
            format!("{} timings of {}", side.name(), file.display())
        })
    };
    let sluice = spread(Side::Sluice)?;
    let pyarrow = spread(Side::Pyarrow)?;
    Ok(PipelineBenchReport {
        file: file.display().to_string(),
        rows,
        batch_rows: BATCH_ROWS,
        rounds,
        load_average_start,
        load_average_end: load_average(),
        ratio_to_pyarrow: sluice.median / pyarrow.median,
        sluice,
        pyarrow,
    })
}

impl PipelineBenchReport {
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
        let rate = |spread: &Spread| {
            format!(
                "{:.2} M [{:.2}..{:.2}]",
                spread.median / 1e6,
                spread.min / 1e6,
                spread.max / 1e6
            )
        };
        // Writing to a String cannot fail.
        writeln!(
            out,
            "Rows/s delivered to one trainer, {} rows in batches of {}: median of {} round(s) [min..max]; load average {} at start, {} at end",
            self.rows,
            self.batch_rows,
            self.rounds,
            format_load(self.load_average_start),
            format_load(self.load_average_end)
        )
        .ok();
        writeln!(
            out,
            "{:<28} {:>24}",
            "sluice (AM + daemon + trainer)",
            rate(&self.sluice)
        )
        .ok();
        writeln!(
            out,
            "{:<28} {:>24}",
            "pyarrow scan in process",
            rate(&self.pyarrow)
        )
        .ok();
        writeln!(
            out,
            "{:<28} {:>23.2}x",
            "sluice / pyarrow", self.ratio_to_pyarrow
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
    fn the_job_is_a_valid_spec_of_one_daemon_and_one_trainer_over_the_file() {
        let spec = job_spec(Path::new("/bin/sluice"), Path::new("/data/f.parquet"));
        let job = JobSpec::parse(&spec, Format::Yaml).expect("a valid job spec");
        assert_eq!(job.nodes, 1);
        assert_eq!(job.roles.len(), 1);
        assert_eq!(job.roles[0].num, 1);
        assert_eq!(job.roles[0].command, ["/bin/sluice", "consume"]);
        assert_eq!(job.data.batch_size as usize, BATCH_ROWS);
        assert_eq!(job.data.sources[0].uri, "file:///data/f.parquet");
    }
}

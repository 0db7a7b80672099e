//! `sluice-bench plan`: planning a Delta table of 1,000 files, `sluice plan` against pyarrow.
//!
//! The table is written once by `sluice gen`'s generator into the cache directory and reused. Each round
//! runs, in turns whose order swaps from one round to the next:
//!
//! - `sluice plan TABLE --json`, timed from spawn to exit: the process, the log replay, the footers of every
//!   file and the JSON of every split;
//! - a pyarrow planner, timed inside the script without the interpreter's start or the import: it replays
//!   the table's JSON commits to find the live files, then reads each file's footer with
//!   `pq.read_metadata` for its row groups, one file after another, as a Python job would.
//!
//! Both sides must find the same number of rows.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sluice_formats::FormatKind;
use sluice_formats::generate::{GenerateOptions, generate};

use crate::command::{Spread, check_pyarrow, display, load_average, run_timed};
use crate::error::{BenchError, Result};

/// The shape of the planned table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanTable {
    /// Data files.
    pub files: u64,
    /// Rows over all files.
    pub rows: u64,
    /// Rows per row group.
    pub row_group_rows: usize,
}

/// The table of a full run: 1,000 files of 10,000 rows, each in 3 row groups.
pub const FULL_TABLE: PlanTable = PlanTable {
    files: 1_000,
    rows: 10_000_000,
    row_group_rows: 4_096,
};
/// The table of a quick run: 100 files.
pub const QUICK_TABLE: PlanTable = PlanTable {
    files: 100,
    rows: 1_000_000,
    row_group_rows: 4_096,
};
/// The longest one planning run may take before it is killed.
const PLAN_TIMEOUT: Duration = Duration::from_secs(300);
/// The seed of the generated rows.
const SEED: u64 = 11;

/// The pyarrow side: plans the table given as the first argument and prints one JSON line.
const PYARROW_SCRIPT: &str = r#"
import json, os, sys, time
import pyarrow.parquet as pq

table = sys.argv[1]
start = time.perf_counter()
log = os.path.join(table, "_delta_log")
live = {}
for name in sorted(n for n in os.listdir(log) if n.endswith(".json")):
    with open(os.path.join(log, name)) as commit:
        for line in commit:
            action = json.loads(line)
            if "add" in action:
                live[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
splits = []
for path in sorted(live):
    metadata = pq.read_metadata(os.path.join(table, path))
    first = 0
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group).num_rows
        splits.append((path, first, rows))
        first += rows
seconds = time.perf_counter() - start
print(json.dumps({"files": len(live), "rows": sum(s[2] for s in splits), "seconds": seconds}))
"#;

/// What `sluice-bench plan` runs.
#[derive(Debug, Clone)]
pub struct PlanBenchOptions {
    /// The `sluice` executable whose `plan` is measured.
    pub sluice: PathBuf,
    /// The Python interpreter that has pyarrow.
    pub python: OsString,
    /// Where the table is written and reused from.
    pub cache_dir: PathBuf,
    /// 100 files and one round, for CI.
    pub quick: bool,
    /// Rounds (at least 1).
    pub rounds: usize,
}

/// Everything one `sluice-bench plan` run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanBenchReport {
    /// The table planned.
    pub table: String,
    /// Its data files.
    pub files: u64,
    /// Its rows.
    pub rows: u64,
    /// Splits in Sluice's plan.
    pub splits: usize,
    /// Rounds.
    pub rounds: usize,
    /// `sluice plan`, seconds from spawn to exit.
    pub sluice_seconds: Spread,
    /// The pyarrow planner, seconds.
    pub pyarrow_seconds: Spread,
    /// Median pyarrow seconds over median Sluice seconds: how many times faster Sluice plans.
    pub speedup: f64,
    /// The 1-minute load average when the run started.
    pub load_average_start: Option<f64>,
    /// The 1-minute load average when the run ended.
    pub load_average_end: Option<f64>,
}

/// One split of `sluice plan --json`, as far as the benchmark reads it.
#[derive(Debug, Deserialize)]
struct PlannedSplit {
    row_count: u64,
}

/// The JSON line of [`PYARROW_SCRIPT`].
#[derive(Debug, Deserialize)]
struct PyarrowPlan {
    files: u64,
    rows: u64,
    seconds: f64,
}

/// Returns the table in `directory`, generating it unless a complete copy is there.
///
/// A table is complete when its first commit lists every file; it is written under a temporary name and
/// renamed into place, so an interrupted run leaves no half-written table under the real name.
fn ensure_table(directory: &Path, table: PlanTable) -> Result<PathBuf> {
    let path = directory.join(format!(
        "delta-{}files-{}rows-{}rg",
        table.files, table.rows, table.row_group_rows
    ));
    let commit = path.join("_delta_log").join("00000000000000000000.json");
    let adds = std::fs::read_to_string(&commit)
        .map(|text| {
            text.lines()
                .filter(|line| line.starts_with("{\"add\""))
                .count()
        })
        .unwrap_or(0);
    if adds as u64 == table.files {
        return Ok(path);
    }
    let partial = directory.join(format!(
        "{}.partial-{}",
        path.file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    let setup = |operation: String| move |source| BenchError::Setup { operation, source };
    if path.exists() {
        std::fs::remove_dir_all(&path).map_err(setup(format!(
            "removing the incomplete table {}",
            path.display()
        )))?;
    }
    let options = GenerateOptions {
        out: partial.display().to_string(),
        rows: table.rows,
        files: table.files,
        format: FormatKind::Delta,
        row_group_rows: table.row_group_rows,
        seed: SEED,
        storage_options: Default::default(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(setup("starting the async runtime".to_owned()))?;
    runtime
        .block_on(generate(&options, &|_| {}))
        .map_err(|source| BenchError::Format {
            operation: format!("generating the table {}", partial.display()),
            source,
        })?;
    std::fs::rename(&partial, &path)
        .map_err(setup(format!("moving {} into place", partial.display())))?;
    Ok(path)
}

/// Runs `sluice plan` on `table` once: the number of splits and rows, and the time.
fn run_sluice(options: &PlanBenchOptions, table: &Path) -> Result<(usize, u64, f64)> {
    let mut command = Command::new(&options.sluice);
    command.arg("plan").arg(table).arg("--json");
    let run = run_timed(&mut command, PLAN_TIMEOUT)?;
    let splits: Vec<PlannedSplit> =
        serde_json::from_str(run.stdout.trim()).map_err(|error| BenchError::CommandOutput {
            command: display(&command),
            stdout: run.stdout.chars().take(200).collect(),
            reason: format!("not the JSON array of `plan --json`: {error}"),
        })?;
    let rows = splits.iter().map(|split| split.row_count).sum();
    Ok((splits.len(), rows, run.elapsed.as_secs_f64()))
}

/// Runs the pyarrow planner on `table` once.
fn run_pyarrow(options: &PlanBenchOptions, table: &Path) -> Result<PyarrowPlan> {
    let mut command = Command::new(&options.python);
    command.args(["-c", PYARROW_SCRIPT]).arg(table);
    let run = run_timed(&mut command, PLAN_TIMEOUT)?;
    serde_json::from_str(run.stdout.trim()).map_err(|error| BenchError::CommandOutput {
        command: display(&command),
        stdout: run.stdout.clone(),
        reason: format!("not the pyarrow planner's JSON: {error}"),
    })
}

/// Runs the planning benchmark; `progress` receives one line per finished run.
///
/// # Errors
///
/// Returns an error when pyarrow is missing, the table cannot be written, a side fails, or the sides find
/// different row counts.
pub fn run_plan_bench(
    options: &PlanBenchOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<PlanBenchReport> {
    if options.rounds == 0 {
        return Err(BenchError::InvalidOption {
            option: "--rounds".to_owned(),
            reason: "0 rounds measure nothing; give at least 1".to_owned(),
        });
    }
    check_pyarrow(&options.python)?;
    let shape = if options.quick {
        QUICK_TABLE
    } else {
        FULL_TABLE
    };
    let rounds = if options.quick { 1 } else { options.rounds };
    let table = ensure_table(&options.cache_dir, shape)?;
    progress(&format!(
        "table {} ({} files)",
        table.display(),
        shape.files
    ));
    let load_average_start = load_average();
    // An untimed run of each side warms the page cache and checks that they agree.
    let (splits, rows, _) = run_sluice(options, &table)?;
    let reference = run_pyarrow(options, &table)?;
    if rows != reference.rows || reference.files != shape.files || rows != shape.rows {
        return Err(BenchError::Disagree {
            what: format!("planning {}", table.display()),
            detail: format!(
                "sluice plans {rows} rows, pyarrow {} rows in {} files; the table holds {} rows in {} files",
                reference.rows, reference.files, shape.rows, shape.files
            ),
        });
    }
    let mut sluice_seconds = Vec::with_capacity(rounds);
    let mut pyarrow_seconds = Vec::with_capacity(rounds);
    for round in 0..rounds {
        for turn in 0..2 {
            if (round + turn) % 2 == 0 {
                let (_, planned_rows, seconds) = run_sluice(options, &table)?;
                if planned_rows != rows {
                    return Err(BenchError::Disagree {
                        what: format!("planning {} again", table.display()),
                        detail: format!("{planned_rows} rows, first {rows}"),
                    });
                }
                progress(&format!("round {}: sluice plan: {seconds:.3} s", round + 1));
                sluice_seconds.push(seconds);
            } else {
                let plan = run_pyarrow(options, &table)?;
                progress(&format!(
                    "round {}: pyarrow: {:.3} s",
                    round + 1,
                    plan.seconds
                ));
                pyarrow_seconds.push(plan.seconds);
            }
        }
    }
    let what = || format!("timings of planning {}", table.display());
    let sluice_seconds = Spread::measured(sluice_seconds, what)?;
    let pyarrow_seconds = Spread::measured(pyarrow_seconds, what)?;
    Ok(PlanBenchReport {
        table: table.display().to_string(),
        files: shape.files,
        rows,
        splits,
        rounds,
        speedup: pyarrow_seconds.median / sluice_seconds.median,
        sluice_seconds,
        pyarrow_seconds,
        load_average_start,
        load_average_end: load_average(),
    })
}

impl PlanBenchReport {
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
        let seconds = |spread: &Spread| {
            format!(
                "{:.3} s [{:.3}..{:.3}]",
                spread.median, spread.min, spread.max
            )
        };
        // Writing to a String cannot fail.
        writeln!(
            out,
            "planning {}: {} files, {} rows, {} splits; median of {} round(s) [min..max]; load average {} at start, {} at end",
            self.table,
            self.files,
            self.rows,
            self.splits,
            self.rounds,
            load(self.load_average_start),
            load(self.load_average_end)
        )
        .ok();
        writeln!(
            out,
            "{:>28} {:>28} {:>9}",
            "sluice plan", "pyarrow", "speedup"
        )
        .ok();
        writeln!(
            out,
            "{:>28} {:>28} {:>8.2}x",
            seconds(&self.sluice_seconds),
            seconds(&self.pyarrow_seconds),
            self.speedup
        )
        .ok();
        out
    }
}

//! `sluice gen`: writes synthetic training data.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sluice_formats::FormatKind;
use sluice_formats::generate::{GenerateOptions, GenerateReport, generate};

use crate::cmd::read::{parse_key_value, runtime};

/// After this long a progress bar appears on stderr.
const PROGRESS_AFTER: Duration = Duration::from_secs(1);

/// Arguments of `sluice gen`.
#[derive(Debug, clap::Args)]
pub struct GenArgs {
    /// Where to write: a directory path or URI.
    #[arg(long)]
    pub out: String,
    /// Total rows (ids 0..rows-1).
    #[arg(long)]
    pub rows: u64,
    /// Number of data files.
    #[arg(long, default_value_t = 1)]
    pub files: u64,
    /// parquet or delta.
    #[arg(long, default_value = "parquet")]
    pub format: String,
    /// Maximum rows per row group.
    #[arg(long, default_value_t = 65_536)]
    pub row_group_rows: usize,
    /// Seed of the values.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Object store setting overriding the environment, as key=value (repeatable).
    #[arg(long = "storage-option", value_parser = parse_key_value)]
    pub storage_options: Vec<(String, String)>,
}

/// Runs `sluice gen`.
pub fn run(args: GenArgs) -> anyhow::Result<()> {
    let options = GenerateOptions {
        out: args.out.clone(),
        rows: args.rows,
        files: args.files,
        format: FormatKind::parse(&args.format)?,
        row_group_rows: args.row_group_rows,
        seed: args.seed,
        storage_options: args.storage_options.iter().cloned().collect(),
    };
    let report = generate_with_progress(&options)?;
    println!(
        "{}",
        serde_json::json!({"out": args.out, "rows": report.rows, "files": report.files.len(), "bytes": report.bytes})
    );
    Ok(())
}

/// Writes `rows` rows of sample data as Parquet files under `out`.
pub fn generate_parquet(
    out: &std::path::Path,
    rows: u64,
    files: u64,
    row_group_rows: usize,
) -> anyhow::Result<()> {
    generate_with_progress(&GenerateOptions {
        out: out.display().to_string(),
        rows,
        files,
        format: FormatKind::Parquet,
        row_group_rows,
        seed: 0,
        storage_options: Default::default(),
    })?;
    Ok(())
}

/// Generates data, with a progress bar on stderr once it takes longer than a second.
fn generate_with_progress(options: &GenerateOptions) -> anyhow::Result<GenerateReport> {
    let bar = ProgressBar::with_draw_target(Some(options.rows), ProgressDrawTarget::hidden());
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} rows {per_sec} eta {eta}")
    {
        bar.set_style(style);
    }
    let started = Instant::now();
    let progress = |rows: u64| {
        if bar.is_hidden() && started.elapsed() > PROGRESS_AFTER {
            bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        bar.set_position(rows);
    };
    let report = runtime(2)?.block_on(generate(options, &progress))?;
    bar.finish_and_clear();
    Ok(report)
}

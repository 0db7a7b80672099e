//! `sluice read`: reads a source through the formats layer, with no AM.

use std::io::Write;
use std::sync::Arc;

use anyhow::Context;
use arrow::array::{Array, RecordBatch};
use futures::{StreamExt, TryStreamExt};
use sluice_formats::{
    Dataset, Expr, FormatKind, LocalIo, OpenOptions, ReadOptions, StorageOptions,
};

/// Rows per split when `--stats` decodes in parallel: small enough to spread a file over the threads.
const STATS_TASK_ROWS: u64 = 131_072;

/// How `sluice read` prints rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// One JSON object per row, as Arrow's JSON writer writes them.
    Jsonl,
    /// CSV with a header row.
    Csv,
    /// An aligned text table.
    Table,
}

/// Arguments of `sluice read`.
#[derive(Debug, clap::Args)]
pub struct ReadArgs {
    /// The source: a path, a file:// s3:// gs:// or az:// URI, a directory, a glob, or a Delta table.
    pub source: String,
    /// Output columns, comma-separated (all columns when absent).
    #[arg(long, value_delimiter = ',')]
    pub columns: Option<Vec<String>>,
    /// Row filter, e.g. "label = 1 and score >= 0.5" (see the filter language in sluice-formats).
    #[arg(long)]
    pub filter: Option<String>,
    /// Delta table version to read.
    #[arg(long)]
    pub version: Option<u64>,
    /// Delta table timestamp (RFC 3339 or epoch milliseconds): reads the version current then.
    #[arg(long)]
    pub timestamp: Option<String>,
    /// Stop after this many rows.
    #[arg(long)]
    pub limit: Option<u64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Jsonl)]
    pub output: OutputFormat,
    /// Decode every selected row and print one JSON object: rows, columns, null_counts.
    #[arg(long)]
    pub stats: bool,
    /// Decoding threads for --stats.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Format of the source when it cannot be told from _delta_log or file extensions.
    #[arg(long)]
    pub format: Option<String>,
    /// Object store setting overriding the environment, as key=value (repeatable).
    #[arg(long = "storage-option", value_parser = parse_key_value)]
    pub storage_options: Vec<(String, String)>,
    /// How local files are read: auto (io_uring where allowed), uring, pread or object-store.
    #[arg(long, value_enum, default_value_t = LocalIoArg::Auto)]
    pub local_io: LocalIoArg,
}

/// `--local-io` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LocalIoArg {
    /// io_uring where the kernel allows it, pread otherwise.
    Auto,
    /// io_uring, a ring and a thread per core.
    Uring,
    /// pread on the blocking pool.
    Pread,
    /// object_store's local file system.
    ObjectStore,
}

impl From<LocalIoArg> for LocalIo {
    fn from(value: LocalIoArg) -> Self {
        match value {
            LocalIoArg::Auto => Self::Auto,
            LocalIoArg::Uring => Self::Uring,
            LocalIoArg::Pread => Self::Pread,
            LocalIoArg::ObjectStore => Self::ObjectStore,
        }
    }
}

/// Parses `key=value`.
pub fn parse_key_value(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .ok_or_else(|| format!("expected key=value, got {text:?}"))
}

/// Builds the open options shared by `read` and `plan`.
pub fn open_options(
    storage_options: &[(String, String)],
    format: Option<&str>,
    version: Option<u64>,
    timestamp: Option<String>,
) -> anyhow::Result<OpenOptions> {
    Ok(OpenOptions {
        storage_options: storage_options.iter().cloned().collect::<StorageOptions>(),
        format: format.map(FormatKind::parse).transpose()?,
        version,
        timestamp,
        ..OpenOptions::default()
    })
}

/// Builds a tokio runtime with `threads` workers.
pub fn runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Runs `sluice read`, printing to stdout.
pub fn run(args: ReadArgs) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    read_to(&args, &mut out)?;
    out.flush()?;
    Ok(())
}

/// Runs `sluice read`, writing its output to `out`.
pub fn read_to(args: &ReadArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    if args.threads == 0 {
        anyhow::bail!("--threads must be at least 1");
    }
    runtime(args.threads)?.block_on(read(args, out))
}

async fn read(args: &ReadArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut options = open_options(
        &args.storage_options,
        args.format.as_deref(),
        args.version,
        args.timestamp.clone(),
    )?;
    options.local_io = args.local_io.into();
    let filter = args.filter.as_deref().map(Expr::parse).transpose()?;
    let read_options = ReadOptions {
        columns: args.columns.clone(),
        filter,
        ..ReadOptions::default()
    };
    let dataset = Arc::new(Dataset::open(&args.source, &options).await?);
    let schema = dataset.output_schema(&read_options)?;
    if args.stats {
        if args.limit.is_some() {
            anyhow::bail!("--limit does not apply to --stats, which decodes every selected row");
        }
        return stats(&dataset, &read_options, args.threads, out).await;
    }
    let mut stream = dataset.scan(&read_options).await?;
    let mut remaining = args.limit.unwrap_or(u64::MAX);
    let mut table_batches = Vec::new();
    let mut header_pending = true;
    while remaining > 0 {
        let Some(batch) = stream.try_next().await? else {
            break;
        };
        let take = usize::try_from(remaining.min(batch.num_rows() as u64)).unwrap_or(usize::MAX);
        let batch = batch.slice(0, take);
        remaining -= take as u64;
        match args.output {
            OutputFormat::Jsonl => {
                let mut writer = arrow::json::LineDelimitedWriter::new(&mut *out);
                writer.write(&batch)?;
                writer.finish()?;
            }
            OutputFormat::Csv => {
                let mut writer = arrow::csv::WriterBuilder::new()
                    .with_header(header_pending)
                    .build(&mut *out);
                writer.write(&batch)?;
                header_pending = false;
            }
            OutputFormat::Table => table_batches.push(batch),
        }
    }
    match args.output {
        OutputFormat::Table => {
            if table_batches.is_empty() {
                table_batches.push(RecordBatch::new_empty(schema));
            }
            writeln!(
                out,
                "{}",
                arrow::util::pretty::pretty_format_batches(&table_batches)?
            )?;
        }
        OutputFormat::Csv if header_pending => {
            let names: Vec<&str> = schema
                .fields()
                .iter()
                .map(|field| field.name().as_str())
                .collect();
            writeln!(out, "{}", names.join(","))?;
        }
        _ => {}
    }
    Ok(())
}

/// Decodes every selected row with `threads` splits in flight and prints rows, columns and null counts.
async fn stats(
    dataset: &Arc<Dataset>,
    options: &ReadOptions,
    threads: usize,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let schema = dataset.output_schema(options)?;
    let splits = dataset.plan(STATS_TASK_ROWS).await?;
    let columns = schema.fields().len();
    let counts = futures::stream::iter(splits.into_iter().map(|split| {
        let dataset = Arc::clone(dataset);
        let options = options.clone();
        tokio::spawn(async move {
            let mut stream = dataset.read_split(&split, &options).await?;
            let mut rows = 0u64;
            let mut nulls = vec![0u64; columns];
            while let Some(batch) = stream.next().await {
                let batch = batch?;
                rows += batch.num_rows() as u64;
                for (slot, column) in nulls.iter_mut().zip(batch.columns()) {
                    *slot += column.logical_null_count() as u64;
                }
            }
            Ok::<_, sluice_formats::FormatError>((rows, nulls))
        })
    }))
    .buffer_unordered(threads.max(1));
    futures::pin_mut!(counts);
    let mut rows = 0u64;
    let mut nulls = vec![0u64; columns];
    while let Some(joined) = counts.next().await {
        let (split_rows, split_nulls) = joined.context("decoding task")??;
        rows += split_rows;
        nulls
            .iter_mut()
            .zip(split_nulls)
            .for_each(|(total, count)| *total += count);
    }
    let names: Vec<String> = schema
        .fields()
        .iter()
        .map(|field| field.name().clone())
        .collect();
    let null_counts: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .zip(&nulls)
        .map(|(name, count)| (name.clone(), serde_json::Value::from(*count)))
        .collect();
    let report = serde_json::json!({ "rows": rows, "columns": names, "null_counts": null_counts });
    writeln!(out, "{report}")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        read: ReadArgs,
    }

    fn sluice_read(arguments: &[&str]) -> anyhow::Result<String> {
        let cli = Cli::try_parse_from(std::iter::once("read").chain(arguments.iter().copied()))?;
        let mut out = Vec::new();
        read_to(&cli.read, &mut out)?;
        Ok(String::from_utf8(out)?)
    }

    #[test]
    fn read_prints_jsonl_csv_and_tables() {
        let testdata = sluice_testkit::testdata();
        let file = testdata.join("parquet/data/alltypes_plain.parquet");
        let file = file.to_string_lossy();
        let jsonl = sluice_read(&[
            &file,
            "--columns",
            "id,bool_col,timestamp_col",
            "--limit",
            "2",
        ])
        .expect("jsonl");
        assert_eq!(
            jsonl,
            "{\"id\":4,\"bool_col\":true,\"timestamp_col\":\"2009-03-01T00:00:00\"}\n{\"id\":5,\"bool_col\":false,\"timestamp_col\":\"2009-03-01T00:01:00\"}\n"
        );
        let csv = sluice_read(&[
            &file,
            "--columns",
            "id,int_col",
            "--filter",
            "id >= 6 or int_col = 0",
            "--output",
            "csv",
        ])
        .expect("csv");
        assert_eq!(csv, "id,int_col\n4,0\n6,0\n7,1\n2,0\n0,0\n");
        let empty = sluice_read(&[
            &file,
            "--columns",
            "id",
            "--filter",
            "id > 100",
            "--output",
            "csv",
        ])
        .expect("empty csv");
        assert_eq!(empty, "id\n");
        let table = sluice_read(&[
            &file,
            "--columns",
            "id",
            "--limit",
            "1",
            "--output",
            "table",
        ])
        .expect("table");
        assert_eq!(table, "+----+\n| id |\n+----+\n| 4  |\n+----+\n");
    }

    #[test]
    fn read_stats_counts_decoded_rows_and_nulls() {
        let testdata = sluice_testkit::testdata();
        let table = testdata.join("delta/table-with-dv-small");
        let stats = sluice_read(&[&table.to_string_lossy(), "--stats"]).expect("stats");
        assert_eq!(
            stats,
            "{\"columns\":[\"value\"],\"null_counts\":{\"value\":0},\"rows\":8}\n"
        );
        let at_zero = sluice_read(&[&table.to_string_lossy(), "--stats", "--version", "0"])
            .expect("stats at version 0");
        assert!(at_zero.contains("\"rows\":10"), "{at_zero}");
        let nulls = testdata.join("parquet/data/datapage_v2.snappy.parquet");
        let parallel =
            sluice_read(&[&nulls.to_string_lossy(), "--stats", "--threads", "2"]).expect("stats");
        let report: serde_json::Value = serde_json::from_str(&parallel).expect("json");
        assert_eq!(report["rows"], 5);
        assert_eq!(report["null_counts"]["a"], 1);
        assert_eq!(report["null_counts"]["e"], 2);
        assert_eq!(report["columns"].as_array().map(Vec::len), Some(5));
    }

    #[test]
    fn read_reports_bad_input_with_the_position_or_the_name() {
        let testdata = sluice_testkit::testdata();
        let file = testdata.join("parquet/data/alltypes_plain.parquet");
        let error =
            sluice_read(&[&file.to_string_lossy(), "--filter", "id >> 3"]).expect_err("bad filter");
        assert!(error.to_string().contains("byte 4"), "{error}");
        let error =
            sluice_read(&[&file.to_string_lossy(), "--columns", "nope"]).expect_err("bad column");
        assert!(error.to_string().contains("\"nope\""), "{error}");
        let error =
            sluice_read(&[&file.to_string_lossy(), "--version", "3"]).expect_err("not delta");
        assert!(error.to_string().contains("Delta tables only"), "{error}");
        let error = sluice_read(&[&file.to_string_lossy(), "--stats", "--limit", "3"])
            .expect_err("limit with stats");
        assert!(error.to_string().contains("--limit"), "{error}");
    }
}

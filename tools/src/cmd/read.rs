//! `sluice read`: reads a source through the formats layer, with no AM.

use std::io::Write;
use std::sync::Arc;

use anyhow::Context;
use arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, GenericListArray, MapArray, OffsetSizeTrait,
    RecordBatch, StringBuilder, StructArray,
};
use arrow::datatypes::{DataType, Field, FieldRef, Fields, Schema};
use arrow::error::ArrowError;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use futures::{StreamExt, TryStreamExt};
use sluice_formats::{
    Dataset, Expr, FormatKind, LocalIo, OpenOptions, ReadOptions, StorageOptions,
};

/// Rows per split when `--stats` decodes in parallel: small enough to spread a file over the threads.
const STATS_TASK_ROWS: u64 = 131_072;

/// How `sluice read` prints rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// One JSON object per row, as Arrow's JSON writer writes them; the keys of a map are strings, as
    /// Spark's `to_json` prints them (a key 1 as "1", a date as "2024-01-31").
    Jsonl,
    /// CSV with a header row.
    Csv,
    /// An aligned text table.
    Table,
    /// An Arrow IPC stream, the batches exactly as a trainer gets them (`pyarrow.ipc.open_stream`).
    Arrow,
}

/// Arguments of `sluice read`.
#[derive(Debug, clap::Args)]
pub struct ReadArgs {
    /// The source: a path, a file:// s3:// gs:// or az:// URI, a directory, a glob, or a Delta or Iceberg table (its directory, or a metadata file).
    pub source: String,
    /// Output columns, comma-separated (all columns when absent).
    #[arg(long, value_delimiter = ',')]
    pub columns: Option<Vec<String>>,
    /// Row filter, e.g. "label = 1 and score >= 0.5" (see the filter language in sluice-formats).
    #[arg(long)]
    pub filter: Option<String>,
    /// Delta table version, or Iceberg snapshot id, to read.
    #[arg(long)]
    pub version: Option<u64>,
    /// Table timestamp (RFC 3339 or epoch milliseconds): reads the Delta version or Iceberg snapshot current then.
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
    /// Format of the source when it cannot be told from _delta_log, Iceberg metadata or file extensions.
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
    options.filter.clone_from(&filter);
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
    if args.output == OutputFormat::Csv
        && let Some(field) = schema
            .fields()
            .iter()
            .find(|field| field.data_type().is_nested())
    {
        let kind = match field.data_type() {
            DataType::Map(..) => "map",
            DataType::Struct(_) => "struct",
            DataType::List(_)
            | DataType::LargeList(_)
            | DataType::FixedSizeList(..)
            | DataType::ListView(_)
            | DataType::LargeListView(_) => "list",
            _ => "nested",
        };
        anyhow::bail!(
            "column {:?} is a {kind} column, which CSV cannot hold; print it with --output jsonl or \
             --output table, or leave it out with --columns",
            field.name()
        );
    }
    let mut stream = dataset.scan(&read_options).await?;
    let mut remaining = args.limit.unwrap_or(u64::MAX);
    if args.output == OutputFormat::Arrow {
        let mut writer = arrow::ipc::writer::StreamWriter::try_new(&mut *out, &schema)?;
        while let Some(batch) = next_within(&mut stream, &mut remaining).await? {
            writer.write(&batch)?;
        }
        writer.finish()?;
        return Ok(());
    }
    let mut table_batches = Vec::new();
    let mut header_pending = true;
    while let Some(batch) = next_within(&mut stream, &mut remaining).await? {
        match args.output {
            OutputFormat::Jsonl => {
                let mut writer = arrow::json::LineDelimitedWriter::new(&mut *out);
                writer.write(&with_string_map_keys(batch)?)?;
                writer.finish()?;
            }
            OutputFormat::Csv => {
                let mut writer = arrow::csv::WriterBuilder::new()
                    .with_header(header_pending)
                    .build(&mut *out);
                writer.write(&batch)?;
                header_pending = false;
            }
            OutputFormat::Table | OutputFormat::Arrow => table_batches.push(batch),
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

/// The next batch of `stream`, cut to the `remaining` rows a `--limit` leaves, which it counts
/// down; `None` at the end or once none remain.
async fn next_within(
    stream: &mut futures::stream::BoxStream<'static, sluice_formats::Result<RecordBatch>>,
    remaining: &mut u64,
) -> anyhow::Result<Option<RecordBatch>> {
    if *remaining == 0 {
        return Ok(None);
    }
    let Some(batch) = stream.try_next().await? else {
        return Ok(None);
    };
    let take = usize::try_from((*remaining).min(batch.num_rows() as u64)).unwrap_or(usize::MAX);
    *remaining -= take as u64;
    Ok(Some(batch.slice(0, take)))
}

/// `batch` with the keys of its maps as strings, maps in structs, lists and map values included: a JSON
/// object's keys are strings, and Arrow's JSON writer refuses a map whose keys are not.
fn with_string_map_keys(batch: RecordBatch) -> Result<RecordBatch, ArrowError> {
    if !batch
        .schema()
        .fields()
        .iter()
        .any(|field| holds_non_string_keys(field.data_type()))
    {
        return Ok(batch);
    }
    let columns = batch
        .columns()
        .iter()
        .map(string_map_keys)
        .collect::<Result<Vec<_>, _>>()?;
    let fields: Vec<FieldRef> = batch
        .schema()
        .fields()
        .iter()
        .zip(&columns)
        .map(|(field, column)| retyped(field, column))
        .collect();
    let schema = Schema::new_with_metadata(fields, batch.schema().metadata().clone());
    RecordBatch::try_new(Arc::new(schema), columns)
}

/// Whether map keys of `data_type` are strings, which the JSON writer takes as they are.
fn is_string(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    )
}

/// Whether `data_type` is, or holds in a struct, a list or a map's values, a map whose keys are not
/// strings.
fn holds_non_string_keys(data_type: &DataType) -> bool {
    match data_type {
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(fields) => match (fields.first(), fields.get(1)) {
                (Some(key), Some(value)) => {
                    !is_string(key.data_type()) || holds_non_string_keys(value.data_type())
                }
                _ => false,
            },
            _ => false,
        },
        DataType::Struct(fields) => fields
            .iter()
            .any(|field| holds_non_string_keys(field.data_type())),
        DataType::List(field) | DataType::LargeList(field) | DataType::FixedSizeList(field, _) => {
            holds_non_string_keys(field.data_type())
        }
        _ => false,
    }
}

/// `field` with the type of `column`.
fn retyped(field: &FieldRef, column: &ArrayRef) -> FieldRef {
    Arc::new(
        field
            .as_ref()
            .clone()
            .with_data_type(column.data_type().clone()),
    )
}

/// `array` with the keys of its maps as strings ([`key_strings`]), wherever [`holds_non_string_keys`]
/// finds them.
fn string_map_keys(array: &ArrayRef) -> Result<ArrayRef, ArrowError> {
    if !holds_non_string_keys(array.data_type()) {
        return Ok(Arc::clone(array));
    }
    Ok(match array.data_type() {
        DataType::Map(entries_field, ordered) => {
            let map = array.as_map();
            let entry_columns = vec![key_strings(map.keys())?, string_map_keys(map.values())?];
            let entry_fields: Fields = map
                .entries()
                .fields()
                .iter()
                .zip(&entry_columns)
                .map(|(field, column)| retyped(field, column))
                .collect();
            let entries_field = Field::new(
                entries_field.name(),
                DataType::Struct(entry_fields.clone()),
                entries_field.is_nullable(),
            );
            let entries =
                StructArray::try_new(entry_fields, entry_columns, map.entries().nulls().cloned())?;
            Arc::new(MapArray::try_new(
                Arc::new(entries_field),
                map.offsets().clone(),
                entries,
                map.nulls().cloned(),
                *ordered,
            )?)
        }
        DataType::Struct(fields) => {
            let array = array.as_struct();
            let columns = array
                .columns()
                .iter()
                .map(string_map_keys)
                .collect::<Result<Vec<_>, _>>()?;
            let fields: Fields = fields
                .iter()
                .zip(&columns)
                .map(|(field, column)| retyped(field, column))
                .collect();
            Arc::new(StructArray::try_new(
                fields,
                columns,
                array.nulls().cloned(),
            )?)
        }
        DataType::List(field) => {
            Arc::new(list_with_string_map_keys(array.as_list::<i32>(), field)?)
        }
        DataType::LargeList(field) => {
            Arc::new(list_with_string_map_keys(array.as_list::<i64>(), field)?)
        }
        DataType::FixedSizeList(field, size) => {
            let list = array.as_fixed_size_list();
            let values = string_map_keys(list.values())?;
            Arc::new(FixedSizeListArray::try_new(
                retyped(field, &values),
                *size,
                values,
                list.nulls().cloned(),
            )?)
        }
        _ => Arc::clone(array),
    })
}

fn list_with_string_map_keys<O: OffsetSizeTrait>(
    list: &GenericListArray<O>,
    field: &FieldRef,
) -> Result<GenericListArray<O>, ArrowError> {
    let values = string_map_keys(list.values())?;
    GenericListArray::try_new(
        retyped(field, &values),
        list.offsets().clone(),
        values,
        list.nulls().cloned(),
    )
}

/// Map keys as strings, as Spark's `to_json` prints them: strings as they are, and any other key as
/// Arrow displays it, which is what Arrow's cast to a string gives for the types it casts (an integer 1
/// as "1", a float 1.5 as "1.5", a date as "2024-01-31", a boolean as "true"); binary keys, which a
/// cast would read as UTF-8, in hex, as the JSON writer prints binary values.
fn key_strings(keys: &ArrayRef) -> Result<ArrayRef, ArrowError> {
    if is_string(keys.data_type()) {
        return Ok(Arc::clone(keys));
    }
    let formatter = ArrayFormatter::try_new(keys.as_ref(), &FormatOptions::default())?;
    let mut strings = StringBuilder::with_capacity(keys.len(), keys.len() * 8);
    for index in 0..keys.len() {
        if keys.is_null(index) {
            strings.append_null();
        } else {
            formatter.value(index).write(&mut strings)?;
            // The value written above is finished by an empty append.
            strings.append_value("");
        }
    }
    Ok(Arc::new(strings.finish()))
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

    /// Writes `maps.parquet` into `directory`: two rows of maps keyed by int32, int64, float64, date32 and
    /// boolean, a map in a struct and maps in a list.
    fn write_maps(directory: &std::path::Path) -> std::path::PathBuf {
        use arrow::array::{
            BooleanBuilder, Date32Builder, Float64Builder, Int32Array, Int32Builder, Int64Builder,
            ListBuilder, MapBuilder,
        };
        let mut by_int32 = MapBuilder::new(None, Int32Builder::new(), StringBuilder::new());
        by_int32.keys().append_slice(&[1, -2]);
        by_int32.values().extend([Some("a"), Some("b")]);
        by_int32.append(true).expect("row");
        by_int32.append(false).expect("a null map");
        let mut by_int64 = MapBuilder::new(None, Int64Builder::new(), Int64Builder::new());
        by_int64.keys().append_value(10_000_000_000);
        by_int64.values().append_value(1);
        by_int64.append(true).expect("row");
        by_int64.append(true).expect("an empty map");
        let mut by_float64 = MapBuilder::new(None, Float64Builder::new(), StringBuilder::new());
        by_float64.keys().append_slice(&[1.5, 1.0]);
        by_float64.values().extend([Some("x"), Some("z")]);
        by_float64.append(true).expect("row");
        by_float64.keys().append_value(-0.25);
        by_float64.values().append_value("y");
        by_float64.append(true).expect("row");
        let mut by_date = MapBuilder::new(None, Date32Builder::new(), Int32Builder::new());
        // 2024-01-31 and 1970-01-01, in days since the epoch.
        by_date.keys().append_slice(&[19_753, 0]);
        by_date.values().append_slice(&[31, 1]);
        by_date.append(true).expect("row");
        by_date.append(true).expect("an empty map");
        let mut by_bool = MapBuilder::new(None, BooleanBuilder::new(), Float64Builder::new());
        by_bool.keys().append_slice(&[true, false]);
        by_bool.values().append_slice(&[0.5, 2.0]);
        by_bool.append(true).expect("row");
        by_bool.keys().append_value(false);
        by_bool.values().append_value(-1.0);
        by_bool.append(true).expect("row");
        let mut tags = MapBuilder::new(None, Int32Builder::new(), StringBuilder::new());
        tags.keys().append_value(7);
        tags.values().append_value("seven");
        tags.append(true).expect("row");
        tags.keys().append_value(8);
        tags.values().append_value("eight");
        tags.append(true).expect("row");
        let tags: ArrayRef = Arc::new(tags.finish());
        let ids: ArrayRef = Arc::new(Int32Array::from(vec![1, 2]));
        let tagged = StructArray::try_new(
            Fields::from(vec![
                Field::new("id", DataType::Int32, false),
                Field::new("tags", tags.data_type().clone(), true),
            ]),
            vec![ids, tags],
            None,
        )
        .expect("struct");
        // Rows: a list of two maps, then an empty list.
        let mut history = ListBuilder::new(MapBuilder::new(
            None,
            Int64Builder::new(),
            Int32Builder::new(),
        ));
        history.values().keys().append_value(3);
        history.values().values().append_value(30);
        history.values().append(true).expect("map");
        history.values().keys().append_value(4);
        history.values().values().append_value(40);
        history.values().append(true).expect("map");
        history.append(true);
        history.append(true);
        let batch = RecordBatch::try_from_iter([
            ("by_int32", Arc::new(by_int32.finish()) as ArrayRef),
            ("by_int64", Arc::new(by_int64.finish()) as ArrayRef),
            ("by_float64", Arc::new(by_float64.finish()) as ArrayRef),
            ("by_date", Arc::new(by_date.finish()) as ArrayRef),
            ("by_bool", Arc::new(by_bool.finish()) as ArrayRef),
            ("tagged", Arc::new(tagged) as ArrayRef),
            ("history", Arc::new(history.finish()) as ArrayRef),
        ])
        .expect("batch");
        let path = directory.join("maps.parquet");
        let file = std::fs::File::create(&path).expect("create");
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).expect("writer");
        writer.write(&batch).expect("write");
        writer.close().expect("close");
        path
    }

    #[test]
    fn read_prints_maps_with_keys_that_are_not_strings_as_json_objects() {
        let directory = tempfile::tempdir().expect("tempdir");
        let file = write_maps(directory.path());
        let file = file.to_string_lossy();
        let jsonl = sluice_read(&[&file, "--output", "jsonl"]).expect("jsonl");
        assert_eq!(
            jsonl.lines().collect::<Vec<_>>(),
            [
                concat!(
                    r#"{"by_int32":{"1":"a","-2":"b"},"by_int64":{"10000000000":1},"#,
                    r#""by_float64":{"1.5":"x","1.0":"z"},"by_date":{"2024-01-31":31,"1970-01-01":1},"#,
                    r#""by_bool":{"true":0.5,"false":2.0},"tagged":{"id":1,"tags":{"7":"seven"}},"#,
                    r#""history":[{"3":30},{"4":40}]}"#
                ),
                concat!(
                    r#"{"by_int64":{},"by_float64":{"-0.25":"y"},"by_date":{},"#,
                    r#""by_bool":{"false":-1.0},"tagged":{"id":2,"tags":{"8":"eight"}},"#,
                    r#""history":[]}"#
                ),
            ]
        );
        let limited =
            sluice_read(&[&file, "--columns", "tagged,by_date", "--limit", "1"]).expect("jsonl");
        assert_eq!(
            limited,
            "{\"tagged\":{\"id\":1,\"tags\":{\"7\":\"seven\"}},\"by_date\":{\"2024-01-31\":31,\"1970-01-01\":1}}\n"
        );
        let table = sluice_read(&[&file, "--columns", "by_int32,by_date", "--output", "table"])
            .expect("table");
        assert_eq!(
            table,
            "+---------------+---------------------------------+\n\
             | by_int32      | by_date                         |\n\
             +---------------+---------------------------------+\n\
             | {1: a, -2: b} | {2024-01-31: 31, 1970-01-01: 1} |\n\
             |               | {}                              |\n\
             +---------------+---------------------------------+\n"
        );
        let error = sluice_read(&[&file, "--output", "csv"]).expect_err("maps in csv");
        assert_eq!(
            error.to_string(),
            "column \"by_int32\" is a map column, which CSV cannot hold; print it with --output jsonl \
             or --output table, or leave it out with --columns"
        );
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
        assert!(
            error.to_string().contains("Delta and Iceberg tables only"),
            "{error}"
        );
        let error = sluice_read(&[&file.to_string_lossy(), "--stats", "--limit", "3"])
            .expect_err("limit with stats");
        assert!(error.to_string().contains("--limit"), "{error}");
    }
}

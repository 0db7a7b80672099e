//! Delta Lake tables written by Spark, Databricks and delta-rs: versions, timestamps, deletion vectors,
//! partition columns, column mapping and checkpoints.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use arrow::array::{Array, Int64Array, RecordBatch};
use arrow::datatypes::DataType;
use futures::TryStreamExt;
use sluice_formats::{Dataset, Expr, OpenOptions, ReadOptions};

fn table(testdata: &Path, name: &str) -> String {
    testdata
        .join("delta")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn at_version(version: u64) -> OpenOptions {
    OpenOptions {
        version: Some(version),
        ..OpenOptions::default()
    }
}

fn int_values(batches: &[RecordBatch], column: &str) -> Vec<i64> {
    let mut values = Vec::new();
    for batch in batches {
        let array = arrow::compute::cast(
            batch.column_by_name(column).expect("column"),
            &DataType::Int64,
        )
        .expect("cast");
        let ints = array.as_any().downcast_ref::<Int64Array>().expect("int64");
        values.extend(ints.iter().map(|value| value.expect("not null")));
    }
    values
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_deletion_vector_removes_rows_at_latest_but_not_at_version_zero() {
    let testdata = sluice_testkit::testdata();
    let uri = table(&testdata, "table-with-dv-small");
    let latest = common::read_all(&uri, &OpenOptions::default(), &ReadOptions::default())
        .await
        .expect("latest");
    let mut values = int_values(&latest, "value");
    values.sort_unstable();
    assert_eq!(
        values,
        (1..=8).collect::<Vec<_>>(),
        "the deletion vector removes the rows with value 0 and 9"
    );
    let first = common::read_all(&uri, &at_version(0), &ReadOptions::default())
        .await
        .expect("version 0");
    let mut values = int_values(&first, "value");
    values.sort_unstable();
    assert_eq!(values, (0..=9).collect::<Vec<_>>());

    let dataset = Dataset::open(&uri, &OpenOptions::default())
        .await
        .expect("opens");
    assert_eq!(dataset.table_version(), Some(1));
    let splits = dataset.plan(3).await.expect("plans");
    assert_eq!(
        splits.iter().map(|split| split.row_count).sum::<u64>(),
        10,
        "splits cover the file's physical rows"
    );
    let mut from_splits = Vec::new();
    for split in &splits {
        let info = split.delta.as_ref().expect("delta info");
        assert_eq!(info.version, 1);
        assert_eq!(
            info.deletion_vector
                .as_ref()
                .map(|vector| vector.cardinality),
            Some(2)
        );
        let batches: Vec<RecordBatch> = dataset
            .read_split(split, &ReadOptions::default())
            .await
            .expect("read")
            .try_collect()
            .await
            .expect("decode");
        from_splits.extend(int_values(&batches, "value"));
    }
    from_splits.sort_unstable();
    assert_eq!(
        from_splits,
        (1..=8).collect::<Vec<_>>(),
        "every split drops the deleted rows of its own range"
    );

    let without = common::read_all(
        &table(&testdata, "table-without-dv-small"),
        &OpenOptions::default(),
        &ReadOptions::default(),
    )
    .await
    .expect("no dv");
    assert_eq!(common::row_count(&without), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_split_of_another_version_is_read_at_its_own_version() {
    let testdata = sluice_testkit::testdata();
    let uri = table(&testdata, "table-with-dv-small");
    let old = Dataset::open(&uri, &at_version(0))
        .await
        .expect("version 0");
    let split = old.plan(100).await.expect("plan").remove(0);
    let latest = Dataset::open(&uri, &OpenOptions::default())
        .await
        .expect("latest");
    assert_eq!(latest.table_version(), Some(1));
    // A split planned at version 0 (as a followed table's splits are, each at its commit) reads
    // the rows as they were then: the deletion vector of version 1 does not apply to it.
    let batches: Vec<RecordBatch> = latest
        .read_split(&split, &ReadOptions::default())
        .await
        .expect("open split")
        .try_collect()
        .await
        .expect("read split");
    let mut values = int_values(&batches, "value");
    values.sort_unstable();
    assert_eq!(values, (0..10).collect::<Vec<_>>());
    // A split claiming a deletion vector the table does not have at its version is refused.
    let mut forged = split.clone();
    if let Some(info) = forged.delta.as_mut() {
        info.version = 1;
    }
    let error = match latest.read_split(&forged, &ReadOptions::default()).await {
        Ok(_) => panic!("a split whose deletion vector differs from its version's must fail"),
        Err(error) => error,
    };
    assert!(error.to_string().contains("deletion vector"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_timestamp_selects_the_version_current_then() {
    let testdata = sluice_testkit::testdata();
    let source = testdata.join("delta/table-with-dv-small");
    let copy = tempfile::tempdir().expect("tempdir");
    let copy_root = copy.path().join("table");
    std::fs::create_dir_all(copy_root.join("_delta_log")).expect("mkdir");
    for entry in std::fs::read_dir(&source).expect("table dir") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            std::fs::copy(&path, copy_root.join(path.file_name().expect("name")))
                .expect("copy data");
        }
    }
    // Commit times come from the commit files' modification times: set them a month apart.
    let commit_times = [
        ("00000000000000000000.json", "2024-01-01T00:00:00Z"),
        ("00000000000000000001.json", "2024-02-01T00:00:00Z"),
    ];
    for (name, time) in commit_times {
        let target = copy_root.join("_delta_log").join(name);
        std::fs::copy(source.join("_delta_log").join(name), &target).expect("copy commit");
        let millis = sluice_formats::delta::parse_timestamp_millis(time).expect("time");
        let modified = std::time::UNIX_EPOCH
            + std::time::Duration::from_millis(u64::try_from(millis).expect("positive"));
        std::fs::File::options()
            .write(true)
            .open(&target)
            .expect("open")
            .set_modified(modified)
            .expect("set mtime");
    }
    let uri = copy_root.to_string_lossy().into_owned();
    let at = |time: &str| OpenOptions {
        timestamp: Some(time.to_string()),
        ..OpenOptions::default()
    };
    let january = common::read_all(&uri, &at("2024-01-15T00:00:00Z"), &ReadOptions::default())
        .await
        .expect("january");
    assert_eq!(
        common::row_count(&january),
        10,
        "version 0 was current in January"
    );
    let march = common::read_all(
        &uri,
        &at("2024-03-01T00:00:00+01:00"),
        &ReadOptions::default(),
    )
    .await
    .expect("march");
    assert_eq!(
        common::row_count(&march),
        8,
        "version 1 was current in March"
    );
    let error = Dataset::open(&uri, &at("2023-06-01T00:00:00Z"))
        .await
        .expect_err("before the first commit");
    assert!(error.to_string().contains("out of range"), "{error}");
    let error = Dataset::open(&uri, &at("yesterday"))
        .await
        .expect_err("not a timestamp");
    assert!(error.to_string().contains("RFC 3339"), "{error}");
}

/// Partition values as the directory names of the file's path give them (`key=value`, Hive null marker).
fn directory_partitions(uri: &str) -> Vec<(String, Option<String>)> {
    uri.split('/')
        .filter_map(|part| part.split_once('='))
        .map(|(key, value)| {
            (
                key.to_string(),
                (value != "__HIVE_DEFAULT_PARTITION__").then(|| value.to_string()),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_partition_columns_have_their_types_values_and_nulls() {
    let testdata = sluice_testkit::testdata();
    let cases = [
        (
            "delta-2.2.0-partitioned-types",
            vec![("c1", DataType::Int32), ("c2", DataType::Utf8)],
            3,
        ),
        (
            "delta-0.8.0-partitioned",
            vec![
                ("year", DataType::Utf8),
                ("month", DataType::Utf8),
                ("day", DataType::Utf8),
            ],
            7,
        ),
        ("delta-0.8.0-null-partition", vec![("k", DataType::Utf8)], 2),
        (
            "partition-type-primitives",
            vec![
                ("year", DataType::Utf8),
                ("is_active", DataType::Utf8),
                ("event_date", DataType::Utf8),
                ("category", DataType::Utf8),
            ],
            16,
        ),
    ];
    for (name, partition_types, rows) in cases {
        let uri = table(&testdata, name);
        let dataset = Dataset::open(&uri, &OpenOptions::default())
            .await
            .expect("opens");
        let schema = dataset.schema();
        for (column, data_type) in &partition_types {
            assert_eq!(
                schema
                    .field_with_name(column)
                    .expect("partition column")
                    .data_type(),
                data_type,
                "{name}.{column}"
            );
        }
        let mut total = 0;
        let mut nulls = 0;
        for split in dataset.plan(1 << 20).await.expect("plan") {
            let batches: Vec<RecordBatch> = dataset
                .read_split(&split, &ReadOptions::default())
                .await
                .expect("read")
                .try_collect()
                .await
                .expect("decode");
            let from_directories = directory_partitions(&split.uri);
            assert_eq!(
                from_directories.len(),
                partition_types.len(),
                "{name}: {} is in partition directories",
                split.uri
            );
            for batch in &batches {
                total += batch.num_rows();
                for (column, value) in &from_directories {
                    let array = arrow::compute::cast(
                        batch.column_by_name(column).expect("column"),
                        &DataType::Utf8,
                    )
                    .expect("as text");
                    let strings = array
                        .as_any()
                        .downcast_ref::<arrow::array::StringArray>()
                        .expect("strings");
                    for row in 0..strings.len() {
                        let actual = strings
                            .is_valid(row)
                            .then(|| strings.value(row).to_string());
                        nulls += usize::from(actual.is_none());
                        assert_eq!(
                            &actual, value,
                            "{name}: {column} of a row from {}",
                            split.uri
                        );
                    }
                }
            }
        }
        assert_eq!(total, rows, "{name}: rows");
        if name == "delta-0.8.0-null-partition" {
            assert_eq!(
                nulls, 1,
                "the row in k=__HIVE_DEFAULT_PARTITION__ has a null k"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_partition_filter_prunes_files_and_keeps_matching_rows() {
    let testdata = sluice_testkit::testdata();
    let uri = table(&testdata, "delta-2.2.0-partitioned-types");
    let options = ReadOptions {
        filter: Some(Expr::parse("c1 >= 5 and c2 != 'a'").expect("parses")),
        ..ReadOptions::default()
    };
    let batches = common::read_all(&uri, &OpenOptions::default(), &options)
        .await
        .expect("filtered");
    assert_eq!(
        common::jsonl(&batches),
        "{\"c1\":5,\"c2\":\"b\",\"c3\":6}\n"
    );
    let options = ReadOptions {
        filter: Some(Expr::parse("k is null").expect("parses")),
        ..ReadOptions::default()
    };
    let batches = common::read_all(
        &table(&testdata, "delta-0.8.0-null-partition"),
        &OpenOptions::default(),
        &options,
    )
    .await
    .expect("null filter");
    assert_eq!(common::jsonl(&batches), "{\"k\":null,\"v\":2}\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_column_mapping_reads_physical_columns_under_logical_names() {
    let testdata = sluice_testkit::testdata();
    let uri = table(&testdata, "table_with_column_mapping");
    let dataset = Dataset::open(&uri, &OpenOptions::default())
        .await
        .expect("opens");
    let names: Vec<String> = dataset
        .schema()
        .fields()
        .iter()
        .map(|field| field.name().clone())
        .collect();
    assert_eq!(names, ["Company Very Short", "Super Name"]);
    let first_file = dataset.file_uris()[0].to_string();
    let raw = Dataset::open(&first_file, &OpenOptions::default())
        .await
        .expect("the data file alone");
    assert!(
        raw.schema()
            .fields()
            .iter()
            .all(|field| field.name().starts_with("col-")),
        "the file stores physical names: {:?}",
        raw.schema()
    );
    let batches = common::read_all(&uri, &OpenOptions::default(), &ReadOptions::default())
        .await
        .expect("reads");
    let raw_batches = common::read_all(
        &first_file,
        &OpenOptions::default(),
        &ReadOptions::default(),
    )
    .await
    .expect("raw");
    assert!(
        common::row_count(&batches) >= common::row_count(&raw_batches)
            && common::row_count(&raw_batches) > 0
    );
    for batch in &batches {
        for column in batch.columns() {
            assert_eq!(
                column.null_count(),
                0,
                "mapped columns are found, not filled with nulls"
            );
        }
    }
    let selected = ReadOptions {
        columns: Some(vec!["Super Name".to_string()]),
        filter: Some(Expr::parse("\"Company Very Short\" = 'BME'").expect("parses")),
        ..ReadOptions::default()
    };
    let filtered = common::read_all(&uri, &OpenOptions::default(), &selected)
        .await
        .expect("filtered");
    assert_eq!(
        common::jsonl(&filtered),
        "{\"Super Name\":\"Timothy Lamb\"}\n"
    );
}

/// Replays the JSON commits up to `version`: the live files are the adds not removed since.
fn replay_json_log(table_dir: &Path, version: u64) -> BTreeSet<String> {
    let mut live = BTreeSet::new();
    for commit in 0..=version {
        let path = table_dir
            .join("_delta_log")
            .join(format!("{commit:020}.json"));
        let text = std::fs::read_to_string(&path).expect("commit");
        for line in text.lines().filter(|line| !line.trim().is_empty()) {
            let action: serde_json::Value = serde_json::from_str(line).expect("json action");
            if let Some(path) = action.pointer("/add/path").and_then(|path| path.as_str()) {
                live.insert(path.to_string());
            }
            if let Some(path) = action
                .pointer("/remove/path")
                .and_then(|path| path.as_str())
            {
                live.remove(path);
            }
        }
    }
    live
}

fn relative_files(dataset: &Dataset, table_dir: &Path) -> BTreeSet<String> {
    let prefix = format!("file://{}/", table_dir.display());
    dataset
        .file_uris()
        .iter()
        .map(|uri| {
            uri.strip_prefix(&prefix)
                .expect("inside the table")
                .to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_checkpoints_and_vacuumed_logs_list_the_same_live_files() {
    let testdata = sluice_testkit::testdata();
    let full = testdata
        .join("delta/checkpoints")
        .canonicalize()
        .expect("table");
    let vacuumed = testdata
        .join("delta/checkpoints_vacuumed")
        .canonicalize()
        .expect("table");
    for version in [5u64, 10, 12] {
        let expected = replay_json_log(&full, version);
        assert!(!expected.is_empty());
        let from_checkpoint = Dataset::open(&full.to_string_lossy(), &at_version(version))
            .await
            .expect("opens");
        assert_eq!(
            relative_files(&from_checkpoint, &full),
            expected,
            "checkpoints at version {version}"
        );
        let from_vacuumed = Dataset::open(&vacuumed.to_string_lossy(), &at_version(version))
            .await
            .expect("opens vacuumed");
        assert_eq!(
            relative_files(&from_vacuumed, &vacuumed),
            expected,
            "checkpoints_vacuumed at version {version}"
        );
    }
    let error = Dataset::open(&vacuumed.to_string_lossy(), &at_version(2))
        .await
        .expect_err("version 2 was vacuumed");
    assert!(
        error.to_string().contains("checkpoints_vacuumed"),
        "{error}"
    );
    // The shared copy of these tables holds their logs only; reading data names the missing file.
    let latest = Dataset::open(&full.to_string_lossy(), &OpenOptions::default())
        .await
        .expect("opens");
    let error = latest.plan(100).await.expect_err("data files are absent");
    assert!(error.to_string().contains(".parquet"), "{error}");
}

/// The row count in a Parquet footer, read with the parquet crate's synchronous reader.
fn footer_rows(path: &Path) -> u64 {
    use parquet::file::reader::FileReader;
    let file =
        std::fs::File::open(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let reader = parquet::file::reader::SerializedFileReader::new(file).expect("footer");
    reader
        .metadata()
        .row_groups()
        .iter()
        .map(|group| group.num_rows() as u64)
        .sum()
}

/// Decodes `%XX` escapes of a log path.
fn percent_decode(text: &str) -> String {
    let mut bytes = Vec::new();
    let mut rest = text.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        let escaped = (first == b'%')
            .then(|| tail.get(..2))
            .flatten()
            .and_then(|hex| u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok());
        if let Some(value) = escaped {
            bytes.push(value);
            rest = &tail[2..];
            continue;
        }
        bytes.push(first);
        rest = tail;
    }
    String::from_utf8(bytes).expect("utf-8 path")
}

/// The row count of the latest version by the log alone: `numRecords` of the live files, less the rows
/// their deletion vectors remove.
fn rows_by_log(table_dir: &Path) -> u64 {
    let mut commits: Vec<u64> = std::fs::read_dir(table_dir.join("_delta_log"))
        .expect("log")
        .filter_map(|entry| {
            entry
                .ok()?
                .file_name()
                .to_str()?
                .strip_suffix(".json")?
                .parse()
                .ok()
        })
        .collect();
    commits.sort_unstable();
    let mut live = std::collections::BTreeMap::new();
    for commit in commits {
        let text = std::fs::read_to_string(
            table_dir
                .join("_delta_log")
                .join(format!("{commit:020}.json")),
        )
        .expect("commit");
        for line in text.lines().filter(|line| !line.trim().is_empty()) {
            let action: serde_json::Value = serde_json::from_str(line).expect("json action");
            if let Some(add) = action.get("add") {
                let path = add["path"].as_str().expect("path").to_string();
                let stats: Option<serde_json::Value> = add["stats"]
                    .as_str()
                    .and_then(|text| serde_json::from_str(text).ok());
                let records = match stats
                    .as_ref()
                    .and_then(|stats| stats["numRecords"].as_u64())
                {
                    Some(records) => records,
                    None => footer_rows(&table_dir.join(percent_decode(&path))),
                };
                let deleted = add
                    .pointer("/deletionVector/cardinality")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0);
                live.insert(path, records - deleted);
            }
            if let Some(path) = action
                .pointer("/remove/path")
                .and_then(|path| path.as_str())
            {
                live.remove(path);
            }
        }
    }
    live.values().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_every_shared_table_with_data_reads_the_rows_its_log_counts() {
    let testdata = sluice_testkit::testdata();
    let tables = [
        "delta-0.8.0",
        "delta-0.8.0-null-partition",
        "delta-0.8.0-partitioned",
        "delta-2.2.0-partitioned-types",
        "golden/data-reader-array-primitives",
        "partition-type-primitives",
        "simple_table",
        "simple_table_with_checkpoint",
        "table-with-dv-small",
        "table-without-dv-small",
        "table_with_column_mapping",
        "table_with_deletion_logs",
    ];
    for name in tables {
        let directory = testdata.join("delta").join(name);
        let expected = rows_by_log(&directory);
        let batches = common::read_all(
            &directory.to_string_lossy(),
            &OpenOptions::default(),
            &ReadOptions::default(),
        )
        .await
        .expect(name);
        assert_eq!(common::row_count(&batches) as u64, expected, "{name}");
        let dataset = Dataset::open(&directory.to_string_lossy(), &OpenOptions::default())
            .await
            .expect(name);
        assert_eq!(
            dataset.kind(),
            sluice_formats::FormatKind::Delta,
            "{name} is read through its log"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_unsupported_reader_feature_is_an_error_naming_it() {
    let testdata = sluice_testkit::testdata();
    let source = testdata.join("delta/table-without-dv-small");
    let copy = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(copy.path().join("_delta_log")).expect("mkdir");
    for entry in std::fs::read_dir(&source).expect("table") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            std::fs::copy(&path, copy.path().join(path.file_name().expect("name"))).expect("copy");
        }
    }
    let commit = std::fs::read_to_string(source.join("_delta_log/00000000000000000000.json"))
        .expect("commit");
    let future_protocol = r#"{"protocol":{"minReaderVersion":3,"minWriterVersion":7,"readerFeatures":["quantumCompression"],"writerFeatures":["quantumCompression"]}}"#;
    let rewritten: Vec<&str> = commit
        .lines()
        .map(|line| {
            if line.starts_with(r#"{"protocol""#) {
                future_protocol
            } else {
                line
            }
        })
        .collect();
    std::fs::write(
        copy.path().join("_delta_log/00000000000000000000.json"),
        rewritten.join("\n"),
    )
    .expect("write");
    let error = Dataset::open(&copy.path().to_string_lossy(), &OpenOptions::default())
        .await
        .expect_err("an unknown reader feature must not be read as if it were absent");
    assert!(error.to_string().contains("quantumCompression"), "{error}");
}

//! Following sources that grow: the Parquet files added to a directory, and the Delta commits
//! after a version (an append, an OPTIMIZE that changes no rows, a DELETE that cannot be followed).

mod common;

use std::collections::HashSet;
use std::path::Path;

use arrow::array::{Array, Int64Array};
use sluice_formats::follow::delta_commits;
use sluice_formats::generate::{GenerateOptions, generate};
use sluice_formats::{Dataset, FormatKind, OpenOptions, ReadOptions};

async fn generate_parquet(directory: &Path, rows: u64, files: u64, seed: u64) -> Vec<String> {
    let options = GenerateOptions {
        out: directory.to_string_lossy().into_owned(),
        rows,
        files,
        format: FormatKind::Parquet,
        row_group_rows: 7,
        seed,
        storage_options: Default::default(),
    };
    generate(&options, &|_| {}).await.expect("generate").files
}

/// The int64 column `name` of every row of a split list, read from `dataset`.
async fn int64_column(dataset: &Dataset, splits: &[sluice_formats::Split], name: &str) -> Vec<i64> {
    use futures::TryStreamExt;
    let options = ReadOptions {
        columns: Some(vec![name.to_owned()]),
        ..ReadOptions::default()
    };
    let mut values = Vec::new();
    for split in splits {
        let batches: Vec<arrow::array::RecordBatch> = dataset
            .read_split(split, &options)
            .await
            .expect("open split")
            .try_collect()
            .await
            .expect("read split");
        for batch in batches {
            let column = batch
                .column_by_name(name)
                .and_then(|column| column.as_any().downcast_ref::<Int64Array>())
                .expect("an int64 column");
            values.extend((0..column.len()).map(|row| column.value(row)));
        }
    }
    values
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_parquet_files_are_found_by_path_and_planned_alone() {
    let root = tempfile::tempdir().expect("tempdir");
    let table = root.path().join("data");
    generate_parquet(&table, 40, 2, 1).await;
    let uri = table.to_string_lossy().into_owned();
    let sut = Dataset::open(&uri, &OpenOptions::default())
        .await
        .expect("open");
    let planned: HashSet<String> = sut
        .plan(16)
        .await
        .expect("plan")
        .into_iter()
        .map(|split| split.uri)
        .collect();
    assert_eq!(planned.len(), 2);
    assert!(
        sut.unplanned_files(&planned)
            .await
            .expect("list")
            .is_empty()
    );

    // A new file, written elsewhere and renamed in; hidden files and a foreign format beside it.
    let staging = root.path().join("staging");
    let written = generate_parquet(&staging, 25, 1, 2).await;
    let written = written[0].trim_start_matches("file://");
    let added = table.join("part-99999.parquet");
    std::fs::rename(written, &added).expect("rename in");
    std::fs::write(table.join("_temporary.parquet"), b"hidden").expect("hidden");
    std::fs::write(table.join(".part-1.parquet.crc"), b"hidden").expect("hidden");
    std::fs::write(table.join("notes.csv"), b"a\n1\n").expect("other format");

    let found = sut.unplanned_files(&planned).await.expect("list");
    let found_uris: Vec<&str> = found.iter().map(|file| file.uri.as_str()).collect();
    assert_eq!(found_uris.len(), 1, "{found_uris:?}");
    assert!(
        found_uris[0].ends_with("/data/part-99999.parquet"),
        "{found_uris:?}"
    );
    let splits = sut.plan_new_file(&found[0], 16).await.expect("plan file");
    assert_eq!(
        splits
            .iter()
            .map(|split| (split.first_row, split.row_count))
            .collect::<Vec<_>>(),
        vec![(0, 14), (14, 11)]
    );
    let mut ids = int64_column(&sut, &splits, "id").await;
    ids.sort_unstable();
    assert_eq!(ids, (0..25).collect::<Vec<i64>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parquet_file_still_being_written_fails_to_plan_naming_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let table = root.path().join("data");
    generate_parquet(&table, 10, 1, 1).await;
    let uri = table.to_string_lossy().into_owned();
    let sut = Dataset::open(&uri, &OpenOptions::default())
        .await
        .expect("open");
    let planned: HashSet<String> = sut.file_uris().into_iter().map(str::to_owned).collect();
    std::fs::write(table.join("part-half.parquet"), b"PAR1 half a file").expect("partial");
    let found = sut.unplanned_files(&planned).await.expect("list");
    assert_eq!(found.len(), 1);
    let error = sut
        .plan_new_file(&found[0], 16)
        .await
        .expect_err("no footer yet");
    assert!(error.to_string().contains("part-half.parquet"), "{error}");
}

/// A copy of the shared table `name` in a temporary directory, so commits can be added to it.
fn copy_table(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let source = sluice_testkit::testdata().join("delta").join(name);
    let copy = tempfile::tempdir().expect("tempdir");
    let root = copy.path().join("table");
    std::fs::create_dir_all(root.join("_delta_log")).expect("mkdir");
    for directory in [&source, &source.join("_delta_log")] {
        for entry in std::fs::read_dir(directory).expect("table dir") {
            let path = entry.expect("entry").path();
            if path.is_file() {
                let relative = path.strip_prefix(&source).expect("inside");
                std::fs::copy(&path, root.join(relative)).expect("copy");
            }
        }
    }
    (copy, root)
}

/// Writes commit `version` of the table at `root`, as a writer would: commitInfo, then actions.
fn write_commit(root: &Path, version: u64, operation: &str, actions: &[String]) {
    let mut lines = vec![format!(
        r#"{{"commitInfo":{{"timestamp":1700000000000,"operation":"{operation}","operationParameters":{{}}}}}}"#
    )];
    lines.extend_from_slice(actions);
    let name = format!("{version:020}.json");
    std::fs::write(root.join("_delta_log").join(name), lines.join("\n") + "\n").expect("commit");
}

fn add_action(path: &str, size: u64, data_change: bool) -> String {
    format!(
        r#"{{"add":{{"path":"{path}","partitionValues":{{}},"size":{size},"modificationTime":1700000000000,"dataChange":{data_change},"stats":"{{\"numRecords\":10}}"}}}}"#
    )
}

fn remove_action(path: &str, data_change: bool) -> String {
    format!(
        r#"{{"remove":{{"path":"{path}","deletionTimestamp":1700000000000,"dataChange":{data_change}}}}}"#
    )
}

const SMALL_TABLE_FILE: &str =
    "part-00000-517f5d32-9c95-48e8-82b4-0229cc194867-c000.snappy.parquet";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_appends_are_followed_optimize_is_skipped_and_a_delete_is_an_error() {
    let (_copy, root) = copy_table("table-without-dv-small");
    let uri = root.to_string_lossy().into_owned();
    let options = OpenOptions::default();
    assert!(
        delta_commits(&uri, &options, 0, None)
            .await
            .expect("log")
            .is_empty()
    );

    // Version 1 appends a second file: a copy of the first one's rows.
    let size = std::fs::metadata(root.join(SMALL_TABLE_FILE))
        .expect("file")
        .len();
    std::fs::copy(
        root.join(SMALL_TABLE_FILE),
        root.join("part-appended.parquet"),
    )
    .expect("copy");
    write_commit(
        &root,
        1,
        "WRITE",
        &[add_action("part-appended.parquet", size, true)],
    );
    let commits = delta_commits(&uri, &options, 0, None).await.expect("log");
    assert_eq!(commits.len(), 1);
    assert_eq!(commits[0].version, 1);
    assert_eq!(commits[0].added.len(), 1);
    assert!(
        commits[0].added[0].ends_with("/table/part-appended.parquet"),
        "{commits:?}"
    );

    // The added file is planned from the snapshot at version 1, and read by a dataset opened at 0.
    let at_one = Dataset::open(
        &uri,
        &OpenOptions {
            version: Some(1),
            ..OpenOptions::default()
        },
    )
    .await
    .expect("open at 1");
    let added: HashSet<String> = commits[0].added.iter().cloned().collect();
    let splits = at_one.plan_files(4, &added).await.expect("plan added");
    assert_eq!(splits.len(), 3, "{splits:?}");
    assert!(splits.iter().all(|split| split.uri == commits[0].added[0]));
    assert!(
        splits
            .iter()
            .all(|split| split.delta.as_ref().map(|info| info.version) == Some(1))
    );
    let at_zero = Dataset::open(
        &uri,
        &OpenOptions {
            version: Some(0),
            ..OpenOptions::default()
        },
    )
    .await
    .expect("open at 0");
    let read = int64_column(&at_zero, &splits, "value").await;
    assert_eq!(read, (0..10).collect::<Vec<i64>>());

    // Version 2 compacts: rows move between files, none change.
    std::fs::copy(
        root.join(SMALL_TABLE_FILE),
        root.join("part-compacted.parquet"),
    )
    .expect("copy");
    write_commit(
        &root,
        2,
        "OPTIMIZE",
        &[
            remove_action("part-appended.parquet", false),
            add_action("part-compacted.parquet", size, false),
        ],
    );
    let commits = delta_commits(&uri, &options, 1, None).await.expect("log");
    assert_eq!(commits.len(), 1);
    assert_eq!(commits[0].version, 2);
    assert!(commits[0].added.is_empty(), "{commits:?}");

    // Version 3 deletes rows: following cannot go on.
    write_commit(
        &root,
        3,
        "DELETE",
        &[remove_action("part-compacted.parquet", true)],
    );
    let error = delta_commits(&uri, &options, 2, None)
        .await
        .expect_err("a delete");
    let message = error.to_string();
    for fragment in [
        "version 3 (DELETE)",
        "part-compacted.parquet",
        "appends only",
    ] {
        assert!(message.contains(fragment), "{message} lacks {fragment}");
    }
    // Up to a last version, the delete after it is not read.
    let commits = delta_commits(&uri, &options, 0, Some(2))
        .await
        .expect("log");
    assert_eq!(
        commits
            .iter()
            .map(|commit| commit.version)
            .collect::<Vec<_>>(),
        vec![1, 2]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_file_of_another_schema_fails_when_read_naming_the_file() {
    use arrow::array::{RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use futures::TryStreamExt;
    let root = tempfile::tempdir().expect("tempdir");
    let table = root.path().join("data");
    generate_parquet(&table, 20, 1, 1).await;
    let uri = table.to_string_lossy().into_owned();
    let sut = Dataset::open(&uri, &OpenOptions::default())
        .await
        .expect("open");
    let planned: HashSet<String> = sut.file_uris().into_iter().map(str::to_owned).collect();
    // A file whose only column is a string `id`: not the job's schema.
    let schema = std::sync::Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, false)]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![std::sync::Arc::new(StringArray::from(vec!["a", "b"]))],
    )
    .expect("batch");
    let file = std::fs::File::create(table.join("part-other.parquet")).expect("create");
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, schema, None).expect("writer");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
    let found = sut.unplanned_files(&planned).await.expect("list");
    assert_eq!(found.len(), 1);
    let splits = sut.plan_new_file(&found[0], 16).await.expect("plan");
    let mut failure = None;
    for split in &splits {
        let read = match sut.read_split(split, &ReadOptions::default()).await {
            Ok(stream) => stream.try_collect::<Vec<RecordBatch>>().await.map(drop),
            Err(error) => Err(error),
        };
        if let Err(error) = read {
            failure = Some(error);
        }
    }
    let error = failure.expect("a file of another schema must not be read as the job's");
    let message = error.to_string();
    assert!(
        message.contains("part-other.parquet") && message.contains("not found"),
        "the error names the file and the missing column: {message}"
    );
}

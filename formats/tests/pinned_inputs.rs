//! Inputs pinned at plan time: a split carries the identity its file had when it was planned, and a
//! read of a file overwritten since, at the same size too, fails naming the file instead of handing
//! out other rows. Local Parquet files through the IO engine and through `object_store`, local Arrow
//! IPC and CSV files, objects on a real S3 server, whose reads carry `If-Match`, and the data file of a
//! Delta table, held to the size the table's log gives it; each read through a dataset opened afresh,
//! as a daemon opens it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch};
use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use sluice_formats::generate::{GenerateOptions, generate};
use sluice_formats::store::open_location;
use sluice_formats::{
    Dataset, FormatError, FormatKind, LocalIo, ObjectIdentity, OpenOptions, ReadOptions, Split,
};
use sluice_testkit::{BUCKET, s3_options, start_seaweed, wait_for_bucket};

/// Rows of each file.
const ROWS: i64 = 1_000;
/// Rows of each split.
const TASK_ROWS: u64 = 250;
/// The first id of an overwrite: its rows are none of the planned ones.
const OTHER_IDS: i64 = 10_000_000;

fn ids(first_id: i64) -> RecordBatch {
    let ids = Int64Array::from_iter_values(first_id..first_id + ROWS);
    RecordBatch::try_from_iter([("id", Arc::new(ids) as ArrayRef)]).expect("batch")
}

/// The ids from `first_id` as a Parquet file whose size depends on its row count alone: plain
/// values, no dictionary, no compression, no statistics.
fn parquet_bytes(first_id: i64) -> Vec<u8> {
    let properties = WriterProperties::builder()
        .set_dictionary_enabled(false)
        .set_compression(Compression::UNCOMPRESSED)
        .set_statistics_enabled(EnabledStatistics::None)
        .set_max_row_group_row_count(Some(TASK_ROWS as usize))
        .build();
    let batch = ids(first_id);
    let mut bytes = Vec::new();
    let mut writer =
        ArrowWriter::try_new(&mut bytes, batch.schema(), Some(properties)).expect("writer");
    writer.write(&batch).expect("write parquet");
    writer.close().expect("close parquet");
    bytes
}

/// The ids from `first_id` as an Arrow IPC file of batches of a split's rows.
fn ipc_bytes(first_id: i64) -> Vec<u8> {
    let batch = ids(first_id);
    let mut writer =
        arrow::ipc::writer::FileWriter::try_new(Vec::new(), &batch.schema()).expect("ipc writer");
    for start in (0..batch.num_rows()).step_by(TASK_ROWS as usize) {
        writer
            .write(&batch.slice(start, TASK_ROWS as usize))
            .expect("write ipc");
    }
    writer.finish().expect("finish ipc");
    writer.into_inner().expect("the file's bytes")
}

/// The ids from `first_id` as a CSV file, each written in eight digits.
fn csv_bytes(first_id: i64) -> Vec<u8> {
    let mut text = String::from("id\n");
    for id in first_id..first_id + ROWS {
        text.push_str(&format!("{id:08}\n"));
    }
    text.into_bytes()
}

async fn read(dataset: &Dataset, split: &Split) -> Result<Vec<i64>, FormatError> {
    let batches: Vec<RecordBatch> = dataset
        .read_split(split, &ReadOptions::default())
        .await?
        .try_collect()
        .await?;
    Ok(batches
        .iter()
        .flat_map(|batch| {
            let ids = batch
                .column_by_name("id")
                .expect("id")
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("int64")
                .clone();
            ids.values().to_vec()
        })
        .collect())
}

/// Overwrites the local file at `path` with `bytes` of the same size, and gives it a modification
/// time a second after the planned one, as a later write would have on any file system's clock.
fn overwrite_local(path: &Path, bytes: &[u8]) {
    let planned = std::fs::metadata(path).expect("the planned file");
    assert_eq!(
        planned.len(),
        bytes.len() as u64,
        "the overwrite keeps the file's size, so that only its identity tells it apart"
    );
    std::fs::write(path, bytes).expect("overwrite");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    let later = planned.modified().expect("mtime") + Duration::from_secs(1);
    file.set_modified(later).expect("set mtime");
}

/// Plans the dataset at `uri`, checks that a dataset opened afresh reads a split as planned, lets
/// `overwrite` change the file, and reads every split through another dataset opened afresh: each
/// fails naming the file, saying it changed and how to fix it. Returns the first error's message.
async fn planned_then_overwritten(
    uri: &str,
    options: &OpenOptions,
    overwrite: impl AsyncFnOnce(),
) -> String {
    let planner = Dataset::open(uri, options).await.expect("opens");
    let splits = planner.plan(TASK_ROWS).await.expect("plans");
    assert_eq!(splits.len(), (ROWS as u64 / TASK_ROWS) as usize, "{uri}");
    assert!(
        splits.iter().all(|split| split.identity.is_some()),
        "{uri}: every split is pinned to its file"
    );
    let reader = Dataset::open(uri, options).await.expect("opens");
    assert_eq!(
        read(&reader, &splits[1])
            .await
            .expect("an unchanged file reads"),
        (TASK_ROWS as i64..2 * TASK_ROWS as i64).collect::<Vec<_>>(),
        "{uri}: the planned rows"
    );
    drop(reader);
    overwrite().await;
    let reader = Dataset::open(uri, options).await.expect("opens");
    let mut messages = Vec::new();
    for split in &splits {
        let error = match read(&reader, split).await {
            Ok(ids) => panic!(
                "{uri}: split {} read {:?}.. of the overwrite",
                split.task_id,
                ids.first()
            ),
            Err(error) => error,
        };
        let message = error.to_string();
        assert!(
            matches!(error, FormatError::FileChanged { .. })
                && message.starts_with(&format!("{uri}: "))
                && message.contains("changed since it was planned")
                && message.contains("plan again"),
            "{uri}: {error:?}"
        );
        messages.push(message);
    }
    println!("{uri}: {}", messages[0]);
    messages.swap_remove(0)
}

/// A local file of `name` written with `bytes(0)`, planned, and overwritten with `bytes(OTHER_IDS)`.
async fn local_file_overwritten(
    name: &str,
    bytes: fn(i64) -> Vec<u8>,
    options: &OpenOptions,
) -> String {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join(name);
    std::fs::write(&path, bytes(0)).expect("write");
    let uri = format!("file://{}", path.display());
    planned_then_overwritten(&uri, options, async || {
        overwrite_local(&path, &bytes(OTHER_IDS))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_parquet_file_overwritten_at_the_same_size_fails_its_splits_naming_it() {
    for local_io in [LocalIo::Auto, LocalIo::ObjectStore] {
        let options = OpenOptions {
            local_io,
            ..OpenOptions::default()
        };
        let message = local_file_overwritten("rows.parquet", parquet_bytes, &options).await;
        assert!(
            message.contains("it was modified at") && message.contains("when planned"),
            "{local_io:?}: {message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_arrow_ipc_file_overwritten_at_the_same_size_fails_its_splits_naming_it() {
    let message = local_file_overwritten("rows.arrow", ipc_bytes, &OpenOptions::default()).await;
    assert!(message.contains("it was modified at"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_csv_file_overwritten_at_the_same_size_fails_its_splits_naming_it() {
    let message = local_file_overwritten("rows.csv", csv_bytes, &OpenOptions::default()).await;
    assert!(message.contains("it was modified at"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_object_overwritten_after_planning_is_refused_by_if_match_naming_it() {
    let server = start_seaweed();
    let storage_options = s3_options();
    wait_for_bucket(&server, &storage_options).await;
    let options = OpenOptions {
        storage_options: storage_options.clone(),
        ..OpenOptions::default()
    };
    for (name, bytes) in [
        ("rows.parquet", parquet_bytes as fn(i64) -> Vec<u8>),
        ("rows.arrow", ipc_bytes),
        ("rows.csv", csv_bytes),
    ] {
        let uri = format!("s3://{BUCKET}/pinned/{name}");
        let location = open_location(&uri, &storage_options).expect("location");
        let put = |content: Vec<u8>| {
            let (store, path) = (Arc::clone(&location.store), location.path.clone());
            async move {
                store
                    .put(&path, PutPayload::from(content))
                    .await
                    .expect("upload");
            }
        };
        put(bytes(0)).await;
        let message = planned_then_overwritten(&uri, &options, async || {
            let other = bytes(OTHER_IDS);
            assert_eq!(other.len(), bytes(0).len(), "{name}: the same size");
            put(other).await;
        })
        .await;
        assert!(
            message.contains("the store refused to read it as planned (If-Match"),
            "{name}: the precondition failed on the server: {message}\n{}",
            server.log()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_tables_data_file_rewritten_at_another_size_fails_its_splits_naming_it() {
    let directory = tempfile::tempdir().expect("tempdir");
    let table = directory
        .path()
        .join("table")
        .to_string_lossy()
        .into_owned();
    let written = generate(
        &GenerateOptions {
            out: table.clone(),
            rows: ROWS as u64,
            files: 1,
            format: FormatKind::Delta,
            row_group_rows: TASK_ROWS as usize,
            seed: 1,
            storage_options: Default::default(),
        },
        &|_| {},
    )
    .await
    .expect("writes the table");
    for local_io in [LocalIo::Auto, LocalIo::ObjectStore] {
        let options = OpenOptions {
            local_io,
            ..OpenOptions::default()
        };
        let planner = Dataset::open(&table, &options).await.expect("opens");
        let splits = planner.plan(TASK_ROWS).await.expect("plans");
        assert!(
            splits
                .iter()
                .all(|split| split.identity == Some(ObjectIdentity::default())),
            "a Delta table's files are pinned by their size in its log"
        );
        let data_file = &written.files[0];
        let path = data_file.strip_prefix("file://").unwrap_or(data_file);
        let planned = std::fs::read(path).expect("the data file");
        // Another Parquet file, of another size, where the table's log places its file.
        std::fs::write(path, parquet_bytes(OTHER_IDS)).expect("rewrite");
        let reader = Dataset::open(&table, &options).await.expect("opens");
        for split in &splits {
            let error = read(&reader, split)
                .await
                .expect_err("a rewritten data file fails its splits");
            let message = error.to_string();
            assert!(
                matches!(error, FormatError::FileChanged { .. })
                    && message.starts_with(&format!("{}: ", split.uri))
                    && message.contains(&format!("had {} bytes when planned", planned.len())),
                "{local_io:?}: {error:?}"
            );
        }
        std::fs::write(path, &planned).expect("restore");
    }
}

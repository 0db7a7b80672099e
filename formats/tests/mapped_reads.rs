//! Column chunks of local files that the page cache holds are decoded straight from a mapping of the
//! file: the rows decoded from it stay right after the file is gone, and a file truncated while it is
//! decoded is an error naming it, never rows of zeros and never a `SIGBUS`. A file rewritten in place at
//! the same length, or replaced by a rename onto its path, after its footer was read is an error naming
//! it too, never another file's rows.

mod common;

use std::sync::Arc;

use arrow::array::{Float64Array, Int64Array, RecordBatch, StringViewArray};
use arrow::datatypes::{DataType, Field, Schema};
use futures::{StreamExt, TryStreamExt};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding};
use parquet::file::properties::WriterProperties;
use sluice_formats::{Dataset, OpenOptions, ReadOptions};

/// Writes `rows` rows of `id` (from `first_id` on), `score` and `name` (a string view, so that the decoder
/// may hand out arrays that point into the page bytes), plain and uncompressed, in row groups of
/// `group_rows`. Every value has the same length whatever the ids (below ten million), so files of the
/// same rows and row groups have the same length.
fn write(path: &std::path::Path, first_id: i64, rows: i64, group_rows: usize) -> RecordBatch {
    let ids = first_id..first_id + rows;
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("score", DataType::Float64, false),
        Field::new("name", DataType::Utf8View, false),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from_iter_values(ids.clone())),
            Arc::new(Float64Array::from_iter_values(
                ids.clone().map(|id| id as f64 * 0.5),
            )),
            Arc::new(StringViewArray::from_iter_values(ids.map(|id| {
                format!("name of row {id:07}, long enough not to be inlined")
            }))),
        ],
    )
    .expect("batch");
    let properties = WriterProperties::builder()
        .set_compression(Compression::UNCOMPRESSED)
        .set_dictionary_enabled(false)
        .set_encoding(Encoding::PLAIN)
        .set_max_row_group_row_count(Some(group_rows))
        .set_data_page_size_limit(16 << 10)
        .build();
    let file = std::fs::File::create(path).expect("create");
    let mut writer = ArrowWriter::try_new(file, schema, Some(properties)).expect("writer");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
    batch
}

/// How a file is changed under a reader.
#[derive(Debug, Clone, Copy)]
enum Change {
    /// Its bytes are overwritten in place, at the same length, and its mtime set a second later.
    InPlace,
    /// Another file of the same length is renamed onto its path.
    Rename,
}

/// Changes the file at `path` into one of the same length whose rows have ids from `first_id` on.
fn change(path: &std::path::Path, how: Change, first_id: i64, rows: i64, group_rows: usize) {
    let other = path.with_extension("other");
    write(&other, first_id, rows, group_rows);
    let length = std::fs::metadata(path).expect("stat").len();
    assert_eq!(
        std::fs::metadata(&other).expect("stat").len(),
        length,
        "the other file has the length of the one it replaces"
    );
    match how {
        Change::InPlace => {
            use std::io::Write;
            let bytes = std::fs::read(&other).expect("read the other file");
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .expect("open for rewriting");
            let modified = file.metadata().expect("stat").modified().expect("mtime");
            file.write_all(&bytes).expect("rewrite in place");
            file.set_modified(modified + std::time::Duration::from_secs(1))
                .expect("set the mtime");
            std::fs::remove_file(&other).expect("remove the other file");
        }
        Change::Rename => std::fs::rename(&other, path).expect("rename onto the path"),
    }
    assert_eq!(std::fs::metadata(path).expect("stat").len(), length);
}

/// The ids of `batch`, which must follow on from `next_id`; returns the id after its last.
fn own_ids(batch: &RecordBatch, mut next_id: i64) -> i64 {
    let ids = batch
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .expect("id");
    for id in ids.values() {
        assert_eq!(
            *id, next_id,
            "rows before the error are the file's own rows"
        );
        next_id += 1;
    }
    next_id
}

fn truncate(path: &std::path::Path, length: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open for truncation")
        .set_len(length)
        .expect("truncate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_decoded_from_a_mapping_outlive_the_file() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join("views.parquet");
    let written = write(&path, 0, 50_000, 20_000);
    let uri = path.to_string_lossy().into_owned();
    let dataset = Arc::new(
        Dataset::open(&uri, &OpenOptions::default())
            .await
            .expect("opens"),
    );
    let batches: Vec<RecordBatch> = dataset
        .scan(&ReadOptions::default())
        .await
        .expect("scans")
        .try_collect()
        .await
        .expect("reads");
    assert!(
        dataset.fetch_stats().mapped_bytes() > 0,
        "the file was just written, so its column chunks are cached and read from a mapping"
    );
    truncate(&path, 0);
    let read = common::jsonl(&batches);
    let expected = common::jsonl(&[written]);
    let differs = read
        .lines()
        .zip(expected.lines())
        .find(|(read, expected)| read != expected);
    assert_eq!(
        differs, None,
        "no decoded array points into the mapping of the file once it is gone"
    );
    assert_eq!(read.lines().count(), expected.lines().count());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_truncated_while_it_is_decoded_is_an_error_naming_it() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join("shrinks.parquet");
    let rows = 400_000;
    write(&path, 0, rows, 400_000);
    let uri = path.to_string_lossy().into_owned();
    let dataset = Arc::new(
        Dataset::open(&uri, &OpenOptions::default())
            .await
            .expect("opens"),
    );
    let options = ReadOptions {
        batch_rows: 1024,
        ..ReadOptions::default()
    };
    let mut stream = dataset.scan(&options).await.expect("scans");
    let first = stream
        .next()
        .await
        .expect("a first batch")
        .expect("decodes");
    assert!(
        dataset.fetch_stats().mapped_bytes() > 0,
        "the row group is read from a mapping"
    );
    // The first page of `id` stays; every later page of the row group is gone.
    truncate(&path, 8 << 10);
    let mut next_id = 0;
    let mut outcome = Ok(());
    let mut batch = Some(first);
    while let Some(decoded) = batch.take() {
        let ids = decoded
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .expect("id");
        for id in ids.values() {
            assert_eq!(
                *id, next_id,
                "rows before the error are the file's own rows"
            );
            next_id += 1;
        }
        match stream.next().await {
            Some(Ok(next)) => batch = Some(next),
            Some(Err(error)) => outcome = Err(error.to_string()),
            None => {}
        }
    }
    let error = outcome.expect_err("a file truncated under the decoder is an error");
    assert!(
        error.contains(&*path.to_string_lossy()) && error.contains("shrank while it was read"),
        "the error names the file and what happened to it: {error}"
    );
    assert!(next_id < rows, "the error ends the read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_changed_after_its_footer_was_read_is_an_error_naming_it() {
    for (how, filter) in [
        (Change::InPlace, None),
        (Change::Rename, None),
        // A filter needs the page index, which the footer read at opening left out: it is read again
        // from the file, which must still be the version the footer came from.
        (Change::InPlace, Some("id >= 0")),
        (Change::Rename, Some("id >= 0")),
    ] {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("changed.parquet");
        let rows = 50_000;
        write(&path, 0, rows, 20_000);
        let uri = path.to_string_lossy().into_owned();
        let dataset = Arc::new(
            Dataset::open(&uri, &OpenOptions::default())
                .await
                .expect("opens"),
        );
        change(&path, how, rows, rows, 20_000);
        let options = ReadOptions {
            filter: filter.map(|text| sluice_formats::Expr::parse(text).expect("filter")),
            ..ReadOptions::default()
        };
        let read: Result<Vec<RecordBatch>, _> = match dataset.scan(&options).await {
            Ok(stream) => stream.try_collect().await,
            Err(error) => Err(error),
        };
        let error = read
            .map(|batches| common::jsonl(&batches).lines().next().map(str::to_string))
            .expect_err("a file changed after its footer was read is an error, not its rows")
            .to_string();
        assert!(
            error.contains(&uri) && error.contains("replaced or rewritten while it was read"),
            "{how:?}, filter {filter:?}: the error names the file and what happened to it: {error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_changed_while_it_is_decoded_is_an_error_naming_it() {
    for how in [Change::InPlace, Change::Rename] {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("changes.parquet");
        let rows = 400_000;
        write(&path, 0, rows, 400_000);
        let uri = path.to_string_lossy().into_owned();
        let dataset = Arc::new(
            Dataset::open(&uri, &OpenOptions::default())
                .await
                .expect("opens"),
        );
        let options = ReadOptions {
            batch_rows: 1024,
            ..ReadOptions::default()
        };
        let mut stream = dataset.scan(&options).await.expect("scans");
        let first = stream
            .next()
            .await
            .expect("a first batch")
            .expect("decodes");
        assert!(
            dataset.fetch_stats().mapped_bytes() > 0,
            "the row group is read from a mapping"
        );
        // The rest of the row group is decoded from the mapping: after the rewrite in place its pages
        // hold the other file's rows; after the rename they still hold this file's rows, but the file at
        // its path is another.
        change(&path, how, rows, rows, 400_000);
        let mut next_id = own_ids(&first, 0);
        let error = loop {
            match stream.next().await {
                Some(Ok(batch)) => next_id = own_ids(&batch, next_id),
                Some(Err(error)) => break error.to_string(),
                None => {
                    panic!("{how:?}: the file changed under the read, which ended without an error")
                }
            }
        };
        assert!(
            error.contains(&uri) && error.contains("replaced or rewritten while it was read"),
            "{how:?}: the error names the file and what happened to it: {error}"
        );
        assert!(next_id < rows, "the error ends the read");
    }
}

//! Column chunks of local files that the page cache holds are decoded straight from a mapping of the
//! file: the rows decoded from it stay right after the file is gone, and a file truncated while it is
//! decoded is an error naming it, never rows of zeros and never a `SIGBUS`.

mod common;

use std::sync::Arc;

use arrow::array::{Float64Array, Int64Array, RecordBatch, StringViewArray};
use arrow::datatypes::{DataType, Field, Schema};
use futures::{StreamExt, TryStreamExt};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding};
use parquet::file::properties::WriterProperties;
use sluice_formats::{Dataset, OpenOptions, ReadOptions};

/// Writes `rows` rows of `id`, `score` and `name` (a string view, so that the decoder may hand out
/// arrays that point into the page bytes), plain and uncompressed, in row groups of `group_rows`.
fn write(path: &std::path::Path, rows: i64, group_rows: usize) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("score", DataType::Float64, false),
        Field::new("name", DataType::Utf8View, false),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from_iter_values(0..rows)),
            Arc::new(Float64Array::from_iter_values(
                (0..rows).map(|id| id as f64 * 0.5),
            )),
            Arc::new(StringViewArray::from_iter_values((0..rows).map(|id| {
                format!("name of row {id}, long enough not to be inlined")
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
    let written = write(&path, 50_000, 20_000);
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
    write(&path, rows, 400_000);
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

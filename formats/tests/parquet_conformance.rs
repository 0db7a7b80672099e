//! The Apache Parquet conformance files: every readable file decodes (matching `*_expect.csv` where given),
//! every corrupt file and every truncated copy of a good file fails cleanly, naming the file.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use futures::TryStreamExt;
use sluice_formats::{Dataset, Expr, OpenOptions, ReadOptions};

/// A read that takes longer than this is a hang.
const HANG_WATCHDOG: Duration = Duration::from_secs(120);

/// Files that arrow-rs, and so this reader, rejects, with the words their error must contain.
const KNOWN_UNREADABLE: &[(&str, &str)] = &[
    // The footer holds a Thrift list of the wrong element type (written by an old parquet-mr).
    (
        "dict-page-offset-zero.parquet",
        "Expected list element type",
    ),
    // Two map entries of 1 GiB strings: one decoded batch of the column would exceed 2 GiB of offsets.
    (
        "large_string_map.brotli.parquet",
        "index overflow decoding byte array",
    ),
    // The dictionary page header is malformed.
    ("nation.dict-malformed.parquet", "Invalid page header"),
];

async fn read_file(path: &Path) -> sluice_formats::Result<Vec<RecordBatch>> {
    let uri = path.to_string_lossy().into_owned();
    let (open, options) = (OpenOptions::default(), ReadOptions::default());
    let read = common::read_all(&uri, &open, &options);
    match tokio::time::timeout(HANG_WATCHDOG, read).await {
        Ok(result) => result,
        Err(_) => panic!(
            "{} did not finish within {HANG_WATCHDOG:?}: the reader hangs",
            path.display()
        ),
    }
}

fn parquet_files(directory: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(directory)
        .expect("readable directory")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| {
            path.extension()
                .is_some_and(|extension| extension == "parquet")
        })
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_every_conformance_file_decodes_or_names_its_problem() {
    let testdata = sluice_testkit::testdata();
    let mut files = parquet_files(&testdata.join("parquet/data"));
    files.extend(parquet_files(&testdata.join("parquet/data/geospatial")));
    assert!(
        files.len() > 70,
        "expected the full conformance set, found {} files",
        files.len()
    );
    let mut decoded = 0;
    for path in &files {
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or_default();
        let expected_failure = KNOWN_UNREADABLE.iter().find(|(file, _)| *file == name);
        match (read_file(path).await, expected_failure) {
            (Ok(batches), None) => {
                let footer_rows = footer_rows(path).await;
                assert_eq!(
                    common::row_count(&batches) as u64,
                    footer_rows,
                    "{name}: decoded rows differ from the footer's row count"
                );
                decoded += 1;
            }
            (Err(error), Some((_, words))) => {
                let message = error.to_string();
                assert!(
                    message.contains(name) && message.contains(words),
                    "{name}: unexpected error: {message}"
                );
            }
            (Ok(_), Some(_)) => {
                panic!("{name} now decodes: remove it from KNOWN_UNREADABLE and check its values")
            }
            (Err(error), None) => panic!("{name} failed to decode: {error}"),
        }
    }
    assert_eq!(decoded, files.len() - KNOWN_UNREADABLE.len());
}

/// The row count in the footer, through the planner (which reads footers only).
async fn footer_rows(path: &Path) -> u64 {
    let dataset = Dataset::open(&path.to_string_lossy(), &OpenOptions::default())
        .await
        .expect("opens");
    dataset
        .plan(u64::MAX)
        .await
        .expect("plans")
        .iter()
        .map(|split| split.row_count)
        .sum()
}

/// Parses CSV text into string columns, so expected and actual values compare as text.
fn csv_columns(text: &[u8], columns: usize) -> Vec<Vec<Option<String>>> {
    let fields: Vec<Field> = (0..columns)
        .map(|index| Field::new(format!("c{index}"), DataType::Utf8, true))
        .collect();
    let reader = arrow::csv::ReaderBuilder::new(Arc::new(Schema::new(fields)))
        .with_header(true)
        .build(std::io::Cursor::new(text.to_vec()))
        .expect("csv reader");
    let mut values = vec![Vec::new(); columns];
    for batch in reader {
        let batch = batch.expect("csv batch");
        for (column, slot) in batch.columns().iter().zip(values.iter_mut()) {
            let strings = column
                .as_any()
                .downcast_ref::<StringArray>()
                .expect("strings");
            slot.extend(strings.iter().map(|value| value.map(str::to_string)));
        }
    }
    values
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_values_match_the_expect_csv_files() {
    let testdata = sluice_testkit::testdata();
    let data = testdata.join("parquet/data");
    let cases = [
        "delta_binary_packed",
        "delta_byte_array",
        "delta_encoding_optional_column",
        "delta_encoding_required_column",
    ];
    for case in cases {
        let batches = read_file(&data.join(format!("{case}.parquet")))
            .await
            .expect("decodes");
        let columns = batches[0].num_columns();
        let mut actual_csv = Vec::new();
        {
            let mut writer = arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut actual_csv);
            for batch in &batches {
                writer.write(batch).expect("csv writer");
            }
        }
        let expected_csv =
            std::fs::read(data.join(format!("{case}_expect.csv"))).expect("expect file");
        let actual = csv_columns(&actual_csv, columns);
        let expected = csv_columns(&expected_csv, columns);
        assert_eq!(actual[0].len(), expected[0].len(), "{case}: row count");
        for (index, (actual_column, expected_column)) in actual.iter().zip(&expected).enumerate() {
            assert_eq!(
                actual_column, expected_column,
                "{case}: column {index} differs"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_bad_data_fails_cleanly() {
    let testdata = sluice_testkit::testdata();
    let files = parquet_files(&testdata.join("parquet/bad_data"));
    assert_eq!(files.len(), 8, "expected the 8 bad_data files");
    for path in files {
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or_default()
            .to_string();
        let result = read_file(&path).await;
        if name == "ARROW-GH-43605.parquet" {
            // An RLE bit width of 0 is legal for a one-entry dictionary: pyarrow reads 21186 zeros too.
            let batches = result.expect("decodes like pyarrow");
            assert_eq!(common::row_count(&batches), 21186);
            continue;
        }
        let error = result.expect_err(&name);
        assert!(
            error.to_string().contains(&name),
            "{name}: the error names the file: {error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_truncated_copies_fail_cleanly() {
    let testdata = sluice_testkit::testdata();
    let directory = tempfile::tempdir().expect("tempdir");
    let originals = [
        "alltypes_plain.parquet",
        "alltypes_tiny_pages.parquet",
        "nested_lists.snappy.parquet",
        "datapage_v2.snappy.parquet",
        "nullable.impala.parquet",
    ];
    for original in originals {
        let bytes = std::fs::read(testdata.join("parquet/data").join(original)).expect("original");
        let length = bytes.len();
        for cut in [
            0,
            3,
            4,
            8,
            length / 3,
            length / 2,
            length - 12,
            length - 8,
            length - 1,
        ] {
            let path = directory
                .path()
                .join(format!("{original}.cut{cut}.parquet"));
            std::fs::write(&path, &bytes[..cut]).expect("write truncated copy");
            let error = read_file(&path)
                .await
                .expect_err("a truncated file cannot decode");
            assert!(
                error.to_string().contains(&format!("cut{cut}")),
                "{original} cut at {cut}: error names the file: {error}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_filters_on_page_indexed_data_match_a_full_scan() {
    let testdata = sluice_testkit::testdata();
    let uri = testdata
        .join("parquet/data/alltypes_tiny_pages.parquet")
        .to_string_lossy()
        .into_owned();
    let all = common::read_all(&uri, &OpenOptions::default(), &ReadOptions::default())
        .await
        .expect("full read");
    let filters = [
        "id = 5000",
        "id >= 1000 and id < 1010",
        "id in (1, 7299, 3650) or tinyint_col = 9 and int_col > 8",
        "not (id > 10) and bool_col",
        "string_col = '3' and id < 200",
        "timestamp_col >= '2010-12-31T00:00:00' and month = 12",
        "float_col is null",
    ];
    for text in filters {
        let expr = Expr::parse(text).expect("parses");
        let mut expected = Vec::new();
        for batch in &all {
            let mask = expr.evaluate(batch).expect("evaluates");
            expected.push(arrow::compute::filter_record_batch(batch, &mask).expect("filters"));
        }
        let options = ReadOptions {
            filter: Some(expr),
            ..ReadOptions::default()
        };
        let actual = common::read_all(&uri, &OpenOptions::default(), &options)
            .await
            .expect("filtered read");
        assert_eq!(
            common::jsonl(&actual),
            common::jsonl(&expected),
            "filter {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_row_range_splits_reassemble_the_file() {
    let testdata = sluice_testkit::testdata();
    for file in [
        "alltypes_tiny_pages.parquet",
        "nested_lists.snappy.parquet",
        "overflow_i16_page_cnt.parquet",
    ] {
        let uri = testdata
            .join("parquet/data")
            .join(file)
            .to_string_lossy()
            .into_owned();
        let dataset = Dataset::open(&uri, &OpenOptions::default())
            .await
            .expect("opens");
        let whole: Vec<RecordBatch> = dataset
            .read_split(
                &dataset.plan(u64::MAX).await.expect("plan")[0],
                &ReadOptions::default(),
            )
            .await
            .expect("read")
            .try_collect()
            .await
            .expect("decode");
        let rows = common::row_count(&whole) as u64;
        for task_rows in [1.max(rows / 40), rows / 7 + 1, 1000, 4096] {
            let splits = dataset.plan(task_rows).await.expect("plan");
            let mut pieces = Vec::new();
            for split in &splits {
                assert!(split.row_count <= task_rows);
                let batches: Vec<RecordBatch> = dataset
                    .read_split(split, &ReadOptions::default())
                    .await
                    .expect("read")
                    .try_collect()
                    .await
                    .expect("decode");
                assert_eq!(
                    common::row_count(&batches) as u64,
                    split.row_count,
                    "{file} split {}",
                    split.task_id
                );
                pieces.extend(batches);
            }
            assert_eq!(
                common::jsonl(&pieces),
                common::jsonl(&whole),
                "{file} with task rows {task_rows}"
            );
        }
    }
}

//! Exact coverage: the batches of a split read tile the split, and each row is where its coverage says,
//! with filters, deletion vectors, and row groups and pages pruned by statistics.

mod common;

use arrow::array::{Array, Int64Array, RecordBatch};
use futures::TryStreamExt;
use sluice_formats::{Dataset, Expr, OpenOptions, ReadOptions, Split, SplitBatch};

/// Reads a split as covered batches and checks that their ranges tile it.
async fn covered(dataset: &Dataset, split: &Split, options: &ReadOptions) -> Vec<SplitBatch> {
    let batches: Vec<SplitBatch> = dataset
        .read_split_covered(split, options)
        .await
        .expect("opens")
        .try_collect()
        .await
        .expect("reads");
    let mut next = 0u64;
    for batch in &batches {
        assert_eq!(
            batch.first_row, next,
            "split {} of {}: batches must follow one another",
            split.task_id, split.uri
        );
        assert!(batch.row_count >= batch.batch.num_rows() as u64);
        next = batch.end();
    }
    assert_eq!(
        next, split.row_count,
        "split {} of {}: batches must cover the split to its end",
        split.task_id, split.uri
    );
    batches
}

/// Each row as `(split row, JSON line)`.
fn rows_at(batches: &[SplitBatch]) -> Vec<(u64, String)> {
    batches
        .iter()
        .flat_map(|covered| {
            let lines = common::jsonl(std::slice::from_ref(&covered.batch));
            let positions = covered.positions();
            assert_eq!(positions.len(), covered.batch.num_rows());
            positions
                .into_iter()
                .zip(lines.lines().map(str::to_owned).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Reads every split of `uri` with and without `filter` and checks that the filtered rows, with their split
/// rows, are the unfiltered ones the filter keeps. Returns how many rows the filter kept.
async fn filtered_equals_filtering_afterwards(
    uri: &str,
    task_rows: u64,
    filter: &str,
    batch_rows: usize,
) -> usize {
    let dataset = Dataset::open(uri, &OpenOptions::default())
        .await
        .expect("opens");
    let expression = Expr::parse(filter).expect("parses");
    let plain = ReadOptions {
        batch_rows,
        ..ReadOptions::default()
    };
    let filtered = ReadOptions {
        filter: Some(expression.clone()),
        ..plain.clone()
    };
    let mut kept = 0;
    for split in dataset.plan(task_rows).await.expect("plans") {
        let everything = covered(&dataset, &split, &plain).await;
        let mut expected = Vec::new();
        for batch in &everything {
            let mask = expression.evaluate(&batch.batch).expect("evaluates");
            let rows = rows_at(std::slice::from_ref(batch));
            expected.extend(
                rows.into_iter()
                    .enumerate()
                    .filter(|(index, _)| mask.is_valid(*index) && mask.value(*index))
                    .map(|(_, row)| row),
            );
        }
        let actual = rows_at(&covered(&dataset, &split, &filtered).await);
        assert_eq!(
            actual, expected,
            "split {} of {uri} with filter {filter}",
            split.task_id
        );
        kept += actual.len();
    }
    kept
}

fn testdata_uri(testdata: &std::path::Path, relative: &str) -> String {
    testdata.join(relative).to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_deletion_vector_and_filter_are_covered_exactly() {
    let testdata = sluice_testkit::testdata();
    let uri = testdata_uri(&testdata, "delta/table-with-dv-small");
    // Values 0..=9, one per row; the deletion vector removes rows 0 and 9.
    for task_rows in [3, 4, 100] {
        for batch_rows in [1, 2, 8192] {
            let kept = filtered_equals_filtering_afterwards(
                &uri,
                task_rows,
                "value >= 3 and value < 7",
                batch_rows,
            )
            .await;
            assert_eq!(kept, 4);
            let kept =
                filtered_equals_filtering_afterwards(&uri, task_rows, "value > 100", batch_rows)
                    .await;
            assert_eq!(kept, 0);
        }
    }
    let dataset = Dataset::open(&uri, &OpenOptions::default())
        .await
        .expect("opens");
    let split = dataset.plan(100).await.expect("plans").remove(0);
    let batches = covered(&dataset, &split, &ReadOptions::default()).await;
    let positions: Vec<u64> = batches.iter().flat_map(SplitBatch::positions).collect();
    assert_eq!(
        positions,
        (1..=8).collect::<Vec<u64>>(),
        "the deleted rows 0 and 9 are covered but not delivered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_index_pruning_is_covered_exactly() {
    let testdata = sluice_testkit::testdata();
    let uri = testdata_uri(&testdata, "parquet/data/alltypes_tiny_pages.parquet");
    for (task_rows, filter, expected) in [
        (1000, "id >= 5000 and id < 5100", 100),
        (7300, "id = 5000 or id = 17", 2),
        (2500, "int_col = 3 and id < 300", 30),
    ] {
        let kept = filtered_equals_filtering_afterwards(&uri, task_rows, filter, 8192).await;
        assert_eq!(kept, expected, "{filter}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_groups_pruned_by_statistics_are_covered_and_rows_keep_their_file_row() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join("groups.parquet");
    let properties = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(100))
        .set_data_page_row_count_limit(10)
        .set_write_batch_size(10)
        .build();
    let file = std::fs::File::create(&path).expect("create");
    let mut writer = parquet::arrow::ArrowWriter::try_new(
        file,
        sluice_formats::generate::schema(),
        Some(properties),
    )
    .expect("writer");
    writer
        .write(&sluice_formats::generate::batch(3, 0, 1000).expect("batch"))
        .expect("write");
    writer.close().expect("close");
    let uri = path.to_string_lossy().into_owned();
    let filter = "(id >= 250 and id < 310) or id = 977";
    for task_rows in [1000, 333, 70] {
        let kept = filtered_equals_filtering_afterwards(&uri, task_rows, filter, 16).await;
        assert_eq!(kept, 61);
    }
    // The generator numbers rows from 0, so a row's file row is its id.
    let dataset = Dataset::open(&uri, &OpenOptions::default())
        .await
        .expect("opens");
    let options = ReadOptions {
        columns: Some(vec!["id".to_string()]),
        filter: Some(Expr::parse(filter).expect("parses")),
        batch_rows: 16,
    };
    for split in dataset.plan(333).await.expect("plans") {
        for batch in covered(&dataset, &split, &options).await {
            let ids = batch
                .batch
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("ids")
                .values()
                .to_vec();
            let file_rows: Vec<i64> = batch
                .positions()
                .into_iter()
                .map(|position| (split.first_row + position) as i64)
                .collect();
            assert_eq!(ids, file_rows);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_formats_are_covered_exactly() {
    let directory = tempfile::tempdir().expect("tempdir");
    let batch = sluice_formats::generate::batch(5, 0, 500).expect("batch");
    let columns: Vec<usize> = ["id", "label"]
        .iter()
        .map(|name| batch.schema().index_of(name).expect("column"))
        .collect();
    let batch: RecordBatch = batch.project(&columns).expect("projects");
    let csv = directory.path().join("rows.csv");
    let mut writer = arrow::csv::Writer::new(std::fs::File::create(&csv).expect("create"));
    writer.write(&batch).expect("write");
    drop(writer);
    let jsonl = directory.path().join("rows.jsonl");
    let mut writer =
        arrow::json::LineDelimitedWriter::new(std::fs::File::create(&jsonl).expect("create"));
    writer.write(&batch).expect("write");
    writer.finish().expect("finish");
    let ipc = directory.path().join("rows.arrow");
    let mut writer = arrow::ipc::writer::FileWriter::try_new(
        std::fs::File::create(&ipc).expect("create"),
        &batch.schema(),
    )
    .expect("writer");
    writer.write(&batch).expect("write");
    writer.finish().expect("finish");
    for path in [csv, jsonl, ipc] {
        let uri = path.to_string_lossy().into_owned();
        let kept =
            filtered_equals_filtering_afterwards(&uri, 128, "id < 40 or id = 300 or id > 497", 7)
                .await;
        assert_eq!(kept, 43, "{uri}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_the_partition_values_prune_is_one_empty_batch() {
    let testdata = sluice_testkit::testdata();
    let uri = testdata_uri(&testdata, "delta/delta-0.8.0-partitioned");
    let dataset = Dataset::open(&uri, &OpenOptions::default())
        .await
        .expect("opens");
    let options = ReadOptions {
        filter: Some(Expr::parse("year = '1900'").expect("parses")),
        ..ReadOptions::default()
    };
    let splits = dataset.plan(100).await.expect("plans");
    assert!(!splits.is_empty());
    for split in splits {
        let batches = covered(&dataset, &split, &options).await;
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].batch.num_rows(), 0);
        assert_eq!(batches[0].batch.schema(), dataset.schema());
    }
}

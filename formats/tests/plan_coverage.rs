//! The planner covers every row exactly once, on data written by the generator as Parquet and as Delta.

mod common;

use std::sync::Arc;

use arrow::array::{Array, Int64Array, RecordBatch};
use futures::{StreamExt, TryStreamExt};
use sluice_formats::generate::{GenerateOptions, generate};
use sluice_formats::{Dataset, FormatKind, OpenOptions, ReadOptions, StorageOptions};

const ROWS: u64 = 10_007;

async fn write(directory: &std::path::Path, format: FormatKind) -> String {
    let out = directory
        .join(format!("{format:?}"))
        .to_string_lossy()
        .into_owned();
    let options = GenerateOptions {
        out: out.clone(),
        rows: ROWS,
        files: 7,
        format,
        row_group_rows: 300,
        seed: 11,
        storage_options: StorageOptions::new(),
    };
    let progress_calls = std::sync::atomic::AtomicU64::new(0);
    let report = generate(&options, &|_| {
        progress_calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    })
    .await
    .expect("generates");
    assert_eq!(report.files.len(), 7);
    assert!(
        progress_calls.into_inner() >= 7,
        "progress is reported per batch"
    );
    out
}

async fn ids_of(dataset: &Arc<Dataset>, task_rows: u64) -> Vec<i64> {
    let splits = dataset.plan(task_rows).await.expect("plans");
    assert_eq!(
        splits,
        dataset.plan(task_rows).await.expect("plans again"),
        "the plan is stable"
    );
    for (index, split) in splits.iter().enumerate() {
        assert_eq!(split.task_id, index as u64);
        assert!(split.row_count > 0 && split.row_count <= task_rows);
    }
    let options = ReadOptions {
        columns: Some(vec!["id".to_string()]),
        ..ReadOptions::default()
    };
    let per_split: Vec<Vec<i64>> = futures::stream::iter(splits.iter().map(|split| {
        let dataset = Arc::clone(dataset);
        let options = options.clone();
        let split = split.clone();
        async move {
            let batches: Vec<RecordBatch> = dataset
                .read_split(&split, &options)
                .await
                .expect("read")
                .try_collect()
                .await
                .expect("decode");
            let ids: Vec<i64> = batches
                .iter()
                .flat_map(|batch| {
                    batch
                        .column(0)
                        .as_any()
                        .downcast_ref::<Int64Array>()
                        .expect("int64")
                        .values()
                        .to_vec()
                })
                .collect();
            assert_eq!(
                ids.len() as u64,
                split.row_count,
                "split {} yields its row count",
                split.task_id
            );
            ids
        }
    }))
    .buffered(4)
    .collect()
    .await;
    per_split.into_iter().flatten().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_covers_every_generated_row_exactly_once() {
    let directory = tempfile::tempdir().expect("tempdir");
    for format in [FormatKind::Parquet, FormatKind::Delta] {
        let out = write(directory.path(), format).await;
        let dataset = Arc::new(
            Dataset::open(&out, &OpenOptions::default())
                .await
                .expect("opens"),
        );
        assert_eq!(dataset.kind(), format);
        assert_eq!(dataset.file_count(), 7);
        for task_rows in [1, 299, 1000, 5000, u64::MAX] {
            if task_rows == 1 {
                let splits = dataset.plan(1).await.expect("plans");
                assert_eq!(splits.len() as u64, ROWS, "one split per row");
                continue;
            }
            let ids = ids_of(&dataset, task_rows).await;
            assert_eq!(
                ids,
                (0..ROWS as i64).collect::<Vec<_>>(),
                "{format:?} with task rows {task_rows}: every id once, in order"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_rows_are_the_same_in_parquet_and_delta() {
    let directory = tempfile::tempdir().expect("tempdir");
    let parquet = write(directory.path(), FormatKind::Parquet).await;
    let delta = write(directory.path(), FormatKind::Delta).await;
    let from_parquet = common::read_all(&parquet, &OpenOptions::default(), &ReadOptions::default())
        .await
        .expect("parquet");
    let from_delta = common::read_all(&delta, &OpenOptions::default(), &ReadOptions::default())
        .await
        .expect("delta");
    assert_eq!(common::jsonl(&from_parquet), common::jsonl(&from_delta));
    let schema = from_parquet[0].schema();
    let names: Vec<&str> = schema
        .fields()
        .iter()
        .map(|field| field.name().as_str())
        .collect();
    assert_eq!(
        names,
        [
            "id",
            "feature_0",
            "feature_1",
            "feature_2",
            "feature_3",
            "embedding",
            "category",
            "label"
        ]
    );
    let nulls: usize = from_parquet
        .iter()
        .map(|batch| batch.column(1).null_count())
        .sum();
    assert!(
        nulls > 0 && nulls < 1000,
        "features have some nulls: {nulls}"
    );
}

//! Helpers shared by the integration tests: reading whole datasets, and running pyarrow.

#![allow(dead_code)]

use std::process::Command;

use arrow::array::RecordBatch;
use futures::TryStreamExt;
use sluice_formats::{Dataset, OpenOptions, ReadOptions};

/// Runs a Python script with arguments, panicking with its stderr when it fails.
pub fn python(script: &str, args: &[&str]) -> String {
    let output = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        output.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8 output")
}

/// Opens a dataset and reads it whole, in plan order.
pub async fn read_all(
    uri: &str,
    open: &OpenOptions,
    options: &ReadOptions,
) -> sluice_formats::Result<Vec<RecordBatch>> {
    let dataset = std::sync::Arc::new(Dataset::open(uri, open).await?);
    dataset.scan(options).await?.try_collect().await
}

/// The rows of the batches as JSON lines, written by Arrow's JSON writer with explicit nulls, so that a null
/// map value or struct field shows as `null` instead of being left out.
pub fn jsonl(batches: &[RecordBatch]) -> String {
    let mut buffer = Vec::new();
    let mut writer = arrow::json::WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, arrow::json::writer::LineDelimited>(&mut buffer);
    for batch in batches {
        writer.write(batch).expect("json writer");
    }
    writer.finish().expect("json writer");
    String::from_utf8(buffer).expect("utf-8 json")
}

/// The total number of rows.
pub fn row_count(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::num_rows).sum()
}

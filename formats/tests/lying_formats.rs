//! Files of the row formats, and table logs, that lie about their sizes and row counts: a TFRecord
//! length of 2^60, an Arrow IPC block or message that claims more bytes or rows than it holds, CSV
//! and JSON lines records that never end or nest without end, and a Delta log whose `add` gives a
//! size or a record count that lies. Each plans and reads to a clean error (bad data where the
//! bytes are at fault), or to the file's true rows: never an abort, an allocation sized by the lie,
//! or a hang.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch};
use futures::TryStreamExt;
use sluice_formats::{Dataset, FormatKind, OpenOptions, ReadOptions};

fn uri_of(path: &Path) -> String {
    format!("file://{}", path.display())
}

/// Plans the source in tasks of 100 rows and reads every split; the rows read, or the first error.
async fn plan_and_read(uri: &str, format: Option<FormatKind>) -> sluice_formats::Result<u64> {
    plan_and_read_in(uri, format, 100).await
}

/// Plans the source in tasks of `task_rows` rows and reads every split; the rows read, or the
/// first error.
async fn plan_and_read_in(
    uri: &str,
    format: Option<FormatKind>,
    task_rows: u64,
) -> sluice_formats::Result<u64> {
    let options = OpenOptions {
        format,
        ..OpenOptions::default()
    };
    let dataset = Arc::new(Dataset::open(uri, &options).await?);
    let mut rows = 0;
    for split in dataset.plan(task_rows).await? {
        let batches: Vec<RecordBatch> = dataset
            .read_split(&split, &ReadOptions::default())
            .await?
            .try_collect()
            .await?;
        rows += batches
            .iter()
            .map(|batch| batch.num_rows() as u64)
            .sum::<u64>();
    }
    Ok(rows)
}

fn assert_bad_data(outcome: sluice_formats::Result<u64>, path: &Path, words: &[&str]) {
    let error = outcome.expect_err("the lying file fails");
    let message = error.to_string();
    assert!(error.is_bad_data(), "bad data: {message}");
    assert!(
        message.contains(&path.display().to_string()),
        "names the file: {message}"
    );
    for word in words {
        assert!(message.contains(word), "names {word}: {message}");
    }
}

#[tokio::test]
async fn a_tfrecord_length_of_two_to_the_60_is_bad_data() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join("huge.tfrecord");
    let mut bytes = sluice_formats::text::tfrecord_encode([b"first".as_slice(), b"second"]);
    let length = (1u64 << 60).to_le_bytes();
    bytes.extend_from_slice(&length);
    bytes.extend_from_slice(&sluice_formats::text::masked_crc32c(&length).to_le_bytes());
    bytes.extend_from_slice(b"a payload far shorter than its length");
    std::fs::write(&path, &bytes).expect("write");
    assert_bad_data(
        plan_and_read(&uri_of(&path), None).await,
        &path,
        &["record at byte 43", "truncated record"],
    );
}

/// Writes an Arrow IPC file of one batch of 777 ids; returns its bytes and the footer's block of
/// the batch as written: (offset, metadata length, body length).
fn ipc_file() -> (Vec<u8>, (i64, i32, i64)) {
    let batch =
        RecordBatch::try_from_iter([("id", Arc::new(Int64Array::from_iter_values(0..777)) as _)])
            .expect("batch");
    let mut bytes = Vec::new();
    let mut writer =
        arrow::ipc::writer::FileWriter::try_new(&mut bytes, &batch.schema()).expect("writer");
    writer.write(&batch).expect("write");
    writer.finish().expect("finish");
    drop(writer);
    let tail = bytes.len() - 10;
    let length = i32::from_le_bytes(bytes[tail..tail + 4].try_into().expect("four bytes"));
    let footer = arrow::ipc::root_as_footer(&bytes[tail - length as usize..tail]).expect("footer");
    let block = footer.recordBatches().expect("batches").get(0);
    (
        bytes.clone(),
        (block.offset(), block.metaDataLength(), block.bodyLength()),
    )
}

/// Replaces every occurrence of `from` in `bytes[range]` with `to`, which must be as long; returns
/// how many it replaced.
fn replace_all(bytes: &mut [u8], range: std::ops::Range<usize>, from: &[u8], to: &[u8]) -> usize {
    let mut replaced = 0;
    let mut at = range.start;
    while at + from.len() <= range.end {
        if &bytes[at..at + from.len()] == from {
            bytes[at..at + from.len()].copy_from_slice(to);
            replaced += 1;
            at += from.len();
        } else {
            at += 1;
        }
    }
    replaced
}

#[tokio::test]
async fn an_arrow_ipc_block_whose_body_length_lies_is_bad_data() {
    let directory = tempfile::tempdir().expect("tempdir");
    let (mut bytes, (offset, metadata, body)) = ipc_file();
    let block = |body: i64| {
        let mut encoded = offset.to_le_bytes().to_vec();
        encoded.extend_from_slice(&metadata.to_le_bytes());
        encoded.extend_from_slice(&[0; 4]);
        encoded.extend_from_slice(&body.to_le_bytes());
        encoded
    };
    let end = bytes.len();
    assert_eq!(
        replace_all(
            &mut bytes,
            offset as usize + 8..end,
            &block(body),
            &block(1 << 60)
        ),
        1
    );
    let path = directory.path().join("body.arrow");
    std::fs::write(&path, &bytes).expect("write");
    assert_bad_data(
        plan_and_read(&uri_of(&path), None).await,
        &path,
        &["1152921504606846976-byte body", "outside the file"],
    );
}

/// The batch's message header claims 2^40 rows (the batch's length and its column's), while its
/// body holds 777: a plan in small tasks is refused before it makes a split, naming the file, and
/// the reads of a plan in large tasks fail as bad data.
#[tokio::test]
async fn an_arrow_ipc_message_whose_row_count_lies_is_refused_or_bad_data() {
    let directory = tempfile::tempdir().expect("tempdir");
    let (mut bytes, (offset, metadata, _)) = ipc_file();
    let header = offset as usize..offset as usize + metadata as usize;
    let replaced = replace_all(
        &mut bytes,
        header,
        &777i64.to_le_bytes(),
        &(1i64 << 40).to_le_bytes(),
    );
    assert_eq!(replaced, 2, "the batch's length and its column's");
    let path = directory.path().join("rows.arrow");
    std::fs::write(&path, &bytes).expect("write");
    let error = plan_and_read(&uri_of(&path), None)
        .await
        .expect_err("the plan is refused");
    let message = error.to_string();
    assert!(
        message.contains(&path.display().to_string())
            && message.contains("claims the most rows (1099511627776)")
            && message.contains("task_rows"),
        "{message}"
    );
    assert_bad_data(
        plan_and_read_in(&uri_of(&path), None, 1 << 30).await,
        &path,
        &[],
    );
}

/// The message's own length prefix (before its header) claims 2^30 bytes: the footer's block, not
/// the prefix, frames the message, and the file's rows read as they are.
#[tokio::test]
async fn an_arrow_ipc_message_length_that_lies_frames_nothing() {
    let directory = tempfile::tempdir().expect("tempdir");
    let (mut bytes, (offset, _, _)) = ipc_file();
    let prefix = offset as usize + 4;
    bytes[prefix..prefix + 4].copy_from_slice(&(1i32 << 30).to_le_bytes());
    let path = directory.path().join("message.arrow");
    std::fs::write(&path, &bytes).expect("write");
    let rows = plan_and_read(&uri_of(&path), None)
        .await
        .expect("the footer frames the message");
    assert_eq!(rows, 777);
}

/// A quoted field that is never closed runs to the end of the file: the record it opens is one
/// record, which does not decode, and no split waits for its end.
#[tokio::test]
async fn a_csv_record_that_never_ends_is_bad_data() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join("open.csv");
    let mut text = String::from("id,name\n");
    for id in 0..300 {
        text.push_str(&format!("{id},name-{id}\n"));
    }
    text.push_str("300,\"an open quote\n");
    for id in 301..600 {
        text.push_str(&format!("{id},name-{id}\n"));
    }
    std::fs::write(&path, text).expect("write");
    let outcome = plan_and_read(&uri_of(&path), None).await;
    match outcome {
        Ok(rows) => assert!(rows <= 301, "no rows past the open quote's record: {rows}"),
        Err(error) => assert!(error.is_bad_data(), "{error}"),
    }
}

/// A JSON line of a million `[` (nesting past any parser's depth) and one whose string never ends.
#[tokio::test]
async fn json_lines_that_nest_without_end_or_never_end_are_bad_data() {
    let directory = tempfile::tempdir().expect("tempdir");
    for (name, line) in [
        ("deep.jsonl", format!("{{\"id\": {}}}", "[".repeat(1 << 20))),
        (
            "open.jsonl",
            "{\"id\": 3, \"name\": \"never closed".to_string(),
        ),
    ] {
        let path = directory.path().join(name);
        let mut text = String::new();
        for id in 0..200 {
            text.push_str(&format!("{{\"id\": {id}, \"name\": \"n{id}\"}}\n"));
        }
        text.push_str(&line);
        text.push('\n');
        std::fs::write(&path, text).expect("write");
        assert_bad_data(plan_and_read(&uri_of(&path), None).await, &path, &[]);
    }
}

/// A copy of the conformance table `table-without-dv-small` (one file of ten rows) whose first
/// commit's `add` is rewritten by `edit`.
fn delta_table(directory: &Path, edit: impl Fn(&mut serde_json::Value)) -> std::path::PathBuf {
    let source = sluice_testkit::testdata().join("delta/table-without-dv-small");
    let table = directory.join("table");
    std::fs::create_dir_all(table.join("_delta_log")).expect("mkdir");
    for entry in std::fs::read_dir(&source).expect("table") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            std::fs::copy(&path, table.join(path.file_name().expect("name"))).expect("copy");
        }
    }
    let log = std::fs::read_dir(source.join("_delta_log")).expect("log");
    for entry in log {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|extension| extension != "json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("commit");
        let lines: Vec<String> = text
            .lines()
            .map(|line| {
                let mut action: serde_json::Value = serde_json::from_str(line).expect("an action");
                if let Some(add) = action.get_mut("add") {
                    edit(add);
                }
                action.to_string()
            })
            .collect();
        std::fs::write(
            table
                .join("_delta_log")
                .join(path.file_name().expect("name")),
            lines.join("\n") + "\n",
        )
        .expect("write the commit");
    }
    table
}

#[tokio::test]
async fn a_delta_add_whose_size_lies_is_a_clean_error() {
    for size in [1u64 << 40, 100] {
        let directory = tempfile::tempdir().expect("tempdir");
        let table = delta_table(directory.path(), |add| add["size"] = size.into());
        let error = plan_and_read(&uri_of(&table), None)
            .await
            .expect_err("a file of another size than the log gives fails");
        let message = error.to_string();
        assert!(message.contains(".parquet"), "names the file: {message}");
        assert!(
            message.contains(&size.to_string()) || message.contains("size"),
            "names the size: {message}"
        );
    }
}

#[tokio::test]
async fn a_delta_add_whose_record_count_lies_plans_the_file_by_its_footer() {
    let directory = tempfile::tempdir().expect("tempdir");
    let table = delta_table(directory.path(), |add| {
        let mut stats: serde_json::Value =
            serde_json::from_str(add["stats"].as_str().expect("stats")).expect("stats json");
        stats["numRecords"] = (1i64 << 62).into();
        add["stats"] = stats.to_string().into();
    });
    let rows = plan_and_read(&uri_of(&table), None)
        .await
        .expect("the footer gives the rows");
    assert_eq!(rows, 10, "the file's rows, not the log's count");
}

//! Row formats read by range: each split of a CSV, JSON lines, Arrow IPC or TFRecord file reads the
//! bytes of its own rows, about its share of the file, from a local file and from S3, counted by the
//! dataset's fetch statistics and by a proxy in front of the S3 server; a CSV's quoted line breaks do
//! not move the splits' bounds; and a file changed after it was planned fails its splits naming it,
//! by its bytes' checks where the plan did not pin the file (`tests/pinned_inputs.rs` pins it).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray};
use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use sluice_formats::store::open_location;
use sluice_formats::text::tfrecord_encode;
use sluice_formats::{Dataset, FormatError, OpenOptions, ReadOptions, Split, StorageOptions};
use sluice_testkit::{
    BUCKET, DelayProxy, s3_options, s3_options_at, start_seaweed, wait_for_bucket,
};

/// Rows of each file.
const ROWS: u64 = 4_000;
/// Rows of each split: eight splits a file.
const TASK_ROWS: u64 = 500;
/// Rows of each record batch of the Arrow IPC file: two batches a split.
const IPC_BATCH_ROWS: usize = 250;
/// What one response costs on the wire besides its body: status line and headers.
const RESPONSE_OVERHEAD: u64 = 2 * 1024;
/// The most an Arrow IPC split reads besides its record batches: the file's footer, read once by the
/// first split of the file.
const IPC_FOOTER_READ: u64 = 16 * 1024;

/// The text of row `id`: quotes, commas and a line break inside the field, so that a reader that looked
/// for `\n` would find two records where there is one.
fn text(id: u64) -> String {
    format!(
        "row {id}, \"quoted\"\n{id},not a record,{}",
        "x".repeat((id % 7) as usize)
    )
}

fn rows() -> RecordBatch {
    let ids = Int64Array::from_iter_values(0..ROWS as i64);
    let texts = StringArray::from_iter_values((0..ROWS).map(text));
    RecordBatch::try_from_iter([
        ("id", Arc::new(ids) as ArrayRef),
        ("text", Arc::new(texts) as ArrayRef),
    ])
    .expect("batch")
}

/// The TFRecord payload of row `id`: its id, then its text.
fn payload(id: u64) -> Vec<u8> {
    let mut payload = id.to_le_bytes().to_vec();
    payload.extend_from_slice(text(id).as_bytes());
    payload
}

/// Writes the same rows as `rows.csv`, `rows.jsonl`, `rows.arrow` and `rows.tfrecord`; returns their
/// names.
fn write_files(directory: &Path) -> Vec<&'static str> {
    let batch = rows();
    let mut writer =
        arrow::csv::Writer::new(std::fs::File::create(directory.join("rows.csv")).expect("create"));
    writer.write(&batch).expect("write csv");
    drop(writer);
    let mut writer = arrow::json::LineDelimitedWriter::new(
        std::fs::File::create(directory.join("rows.jsonl")).expect("create"),
    );
    writer.write(&batch).expect("write jsonl");
    writer.finish().expect("finish jsonl");
    let mut writer = arrow::ipc::writer::FileWriter::try_new(
        std::fs::File::create(directory.join("rows.arrow")).expect("create"),
        &batch.schema(),
    )
    .expect("ipc writer");
    for start in (0..batch.num_rows()).step_by(IPC_BATCH_ROWS) {
        writer
            .write(&batch.slice(start, IPC_BATCH_ROWS))
            .expect("write ipc");
    }
    writer.finish().expect("finish ipc");
    let payloads: Vec<Vec<u8>> = (0..ROWS).map(payload).collect();
    std::fs::write(
        directory.join("rows.tfrecord"),
        tfrecord_encode(payloads.iter().map(Vec::as_slice)),
    )
    .expect("write tfrecord");
    vec!["rows.csv", "rows.jsonl", "rows.arrow", "rows.tfrecord"]
}

/// Each row read as `(id, text)`.
fn id_texts(batches: &[RecordBatch]) -> Vec<(u64, String)> {
    let mut rows = Vec::new();
    for batch in batches {
        if let Some(records) = batch.column_by_name("record") {
            let records = records
                .as_any()
                .downcast_ref::<BinaryArray>()
                .expect("binary");
            for record in records.iter().flatten() {
                let (id, text) = record.split_at(8);
                let id = u64::from_le_bytes(id.try_into().expect("8 bytes"));
                rows.push((id, String::from_utf8(text.to_vec()).expect("utf-8")));
            }
            continue;
        }
        let ids = batch
            .column_by_name("id")
            .expect("id")
            .as_any()
            .downcast_ref::<Int64Array>()
            .expect("int64");
        let texts = batch
            .column_by_name("text")
            .expect("text")
            .as_any()
            .downcast_ref::<StringArray>()
            .expect("utf8");
        rows.extend(
            ids.values()
                .iter()
                .zip(texts.iter())
                .map(|(id, text)| (*id as u64, text.expect("a text").to_owned())),
        );
    }
    rows
}

async fn read(dataset: &Dataset, split: &Split) -> Result<Vec<RecordBatch>, FormatError> {
    dataset
        .read_split(split, &ReadOptions::default())
        .await?
        .try_collect()
        .await
}

/// What one split read: its bytes, and the bytes fetched for it.
struct TaskRead {
    range: u64,
    fetched: u64,
}

/// Reads every split of the dataset at `uri`, counting the bytes each fetches with `counter`, and
/// checks that the splits hand out every row once, in order, with its text.
async fn read_by_task(
    uri: &str,
    options: &StorageOptions,
    counter: impl Fn(&Dataset) -> u64,
) -> (u64, Vec<TaskRead>) {
    let open = OpenOptions {
        storage_options: options.clone(),
        ..OpenOptions::default()
    };
    let dataset = Dataset::open(uri, &open).await.expect("opens");
    let splits = dataset.plan(TASK_ROWS).await.expect("plans");
    assert_eq!(
        splits
            .iter()
            .map(|split| split.row_count)
            .collect::<Vec<_>>(),
        vec![TASK_ROWS; (ROWS / TASK_ROWS) as usize],
        "{uri}: splits of {TASK_ROWS} rows"
    );
    let mut rows = Vec::new();
    let mut reads = Vec::new();
    for split in &splits {
        let bytes = split.bytes.expect("a row format's split carries its bytes");
        let before = counter(&dataset);
        let batches = read(&dataset, split).await.expect("reads");
        reads.push(TaskRead {
            range: bytes.len(),
            fetched: counter(&dataset) - before,
        });
        rows.extend(id_texts(&batches));
    }
    let expected: Vec<(u64, String)> = (0..ROWS).map(|id| (id, text(id))).collect();
    assert!(
        rows == expected,
        "{uri}: every row once, in order, with its text"
    );
    (splits[0].file_size, reads)
}

/// The table of what each split read, for the test's output.
fn report(uri: &str, size: u64, reads: &[TaskRead]) -> String {
    let mut table = format!("{uri}: {size} bytes, {} splits\n", reads.len());
    for (task, read) in reads.iter().enumerate() {
        writeln!(
            table,
            "  split {task}: {} bytes of rows, {} bytes fetched",
            read.range, read.fetched
        )
        .expect("write");
    }
    let total: u64 = reads.iter().map(|read| read.fetched).sum();
    writeln!(table, "  all splits: {total} bytes fetched").expect("write");
    table
}

/// Checks that each split fetched its range and at most `overhead` more (plus the footer, for the
/// first split of an Arrow IPC file), that its range is about its share of the file, and that all
/// splits together fetched about the file once.
fn assert_each_split_reads_its_share(name: &str, size: u64, reads: &[TaskRead], overhead: u64) {
    let ipc = name.ends_with(".arrow");
    let share = size / reads.len() as u64;
    for (task, read) in reads.iter().enumerate() {
        let footer = if ipc && task == 0 { IPC_FOOTER_READ } else { 0 };
        assert!(
            read.fetched >= read.range && read.fetched <= read.range + overhead + footer,
            "{name}: split {task} fetched {} bytes for its {} bytes of rows",
            read.fetched,
            read.range
        );
        assert!(
            read.range <= share + share / 10,
            "{name}: split {task} holds {} bytes, its share of {size} is {share}",
            read.range
        );
    }
    let total: u64 = reads.iter().map(|read| read.fetched).sum();
    let bound = size + reads.len() as u64 * overhead + if ipc { IPC_FOOTER_READ } else { 0 };
    assert!(
        total <= bound,
        "{name}: {} splits fetched {total} bytes of a {size}-byte file",
        reads.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_split_of_a_local_file_reads_its_share() {
    let directory = tempfile::tempdir().expect("tempdir");
    for name in write_files(directory.path()) {
        let uri = directory.path().join(name).to_string_lossy().into_owned();
        let (size, reads) = read_by_task(&uri, &StorageOptions::new(), |dataset| {
            dataset.fetch_stats().bytes()
        })
        .await;
        println!("{}", report(name, size, &reads));
        assert_each_split_reads_its_share(name, size, &reads, 0);
        if !name.ends_with(".arrow") {
            assert!(
                reads.iter().all(|read| read.fetched == read.range),
                "{name}: a text split fetches exactly its bytes"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_split_of_an_s3_object_reads_its_share_on_the_wire() {
    let server = start_seaweed();
    let options = s3_options();
    wait_for_bucket(&server, &options).await;
    let directory = tempfile::tempdir().expect("tempdir");
    let names = write_files(directory.path());
    let location = open_location(&format!("s3://{BUCKET}/ranges"), &options).expect("location");
    for name in &names {
        let bytes = std::fs::read(directory.path().join(name)).expect("read");
        location
            .store
            .put(&location.path.clone().join(*name), PutPayload::from(bytes))
            .await
            .expect("upload");
    }
    let proxy = DelayProxy::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        server.address(),
        Duration::ZERO,
        None,
    );
    let through_proxy: StorageOptions = s3_options_at(proxy.address());
    for name in names {
        let uri = format!("s3://{BUCKET}/ranges/{name}");
        let (size, reads) = read_by_task(&uri, &through_proxy, |_| proxy.bytes_to_client()).await;
        println!("{}", report(&uri, size, &reads));
        assert_each_split_reads_its_share(name, size, &reads, RESPONSE_OVERHEAD);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quoted_line_breaks_across_split_bounds_keep_every_csv_row_whole() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join("quoted.csv");
    // Each quoted field holds what looks like a record on its own line; splits of two rows end right
    // after such fields.
    let content = "id,text\r\n\
        0,\"a\n9,fake\"\r\n\
        1,\"b\r\n9,fake\"\n\
        2,plain\n\
        \n\
        3,\"\"\"c\"\"\n9,fake\n\"\n\
        4,\"d,\"\"e\"\"\"\n";
    std::fs::write(&path, content).expect("write");
    let uri = path.to_string_lossy().into_owned();
    let dataset = Dataset::open(&uri, &OpenOptions::default())
        .await
        .expect("opens");
    let splits = dataset.plan(2).await.expect("plans");
    assert_eq!(
        splits
            .iter()
            .map(|split| (split.first_row, split.row_count))
            .collect::<Vec<_>>(),
        vec![(0, 2), (2, 2), (4, 1)],
        "five rows, whatever their lines"
    );
    let mut rows = Vec::new();
    for split in &splits {
        rows.extend(id_texts(&read(&dataset, split).await.expect("reads")));
    }
    let expected = [
        "a\n9,fake",
        "b\r\n9,fake",
        "plain",
        "\"c\"\n9,fake\n",
        "d,\"e\"",
    ];
    assert_eq!(
        rows,
        expected
            .iter()
            .enumerate()
            .map(|(id, text)| (id as u64, text.to_string()))
            .collect::<Vec<_>>()
    );
}

/// The error reading `split` gives, which must name the file and say how to fix it.
async fn changed_error(dataset: &Dataset, split: &Split, uri: &str) -> String {
    let error = read(dataset, split)
        .await
        .expect_err("a changed file fails its split");
    assert!(
        matches!(error, FormatError::FileChanged { .. }),
        "{uri}: {error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains(uri) && message.contains("plan again"),
        "{message}"
    );
    message
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_changed_after_it_was_planned_fails_its_splits_naming_it() {
    let directory = tempfile::tempdir().expect("tempdir");
    for name in write_files(directory.path()) {
        let path = directory.path().join(name);
        let uri = path.to_string_lossy().into_owned();
        let dataset = Dataset::open(&uri, &OpenOptions::default())
            .await
            .expect("opens");
        let splits = dataset.plan(TASK_ROWS).await.expect("plans");
        let original = std::fs::read(&path).expect("read");

        // The same length, one byte of the last split's rows changed: the bytes are not the
        // planned ones. An Arrow IPC split is checked against its footer, not its bytes: rewrite
        // it with other batches instead.
        let last = splits.last().expect("splits");
        if name.ends_with(".arrow") {
            let batch = rows();
            let mut writer = arrow::ipc::writer::FileWriter::try_new(
                std::fs::File::create(&path).expect("create"),
                &batch.schema(),
            )
            .expect("ipc writer");
            writer.write(&batch).expect("write ipc");
            writer.finish().expect("finish ipc");
            let message = changed_error(&dataset, last, &uri).await;
            println!("{name}, rewritten: {message}");
        } else {
            let bytes = last.bytes.expect("bytes");
            let mut edited = original.clone();
            let inside = usize::try_from(bytes.start + bytes.len() / 2).expect("offset");
            edited[inside] = if edited[inside] == b'x' { b'y' } else { b'x' };
            std::fs::write(&path, &edited).expect("rewrite");
            // Splits of a plan that did not pin their file (a plan of format 3): the CRC32C of the
            // bytes tells the change, and a split whose bytes did not change still reads.
            let unpinned = |split: &Split| Split {
                identity: None,
                ..split.clone()
            };
            let message = changed_error(&dataset, &unpinned(last), &uri).await;
            assert!(message.contains("CRC32C"), "{message}");
            println!("{name}, one byte changed: {message}");
            read(&dataset, &unpinned(&splits[0]))
                .await
                .expect("a split whose bytes did not change reads as planned");
        }

        // Longer: every split fails, and says how the size changed.
        let mut longer = original.clone();
        longer.extend_from_slice(b"\n");
        std::fs::write(&path, &longer).expect("append");
        let message = changed_error(&dataset, &splits[0], &uri).await;
        assert!(
            message.contains(&format!("{} bytes", original.len())),
            "{message}"
        );
        println!("{name}, grown: {message}");
    }
}

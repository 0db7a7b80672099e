//! Inputs pinned at plan time, on the real path: `sluice am` plans a job over two local files and
//! serves it (or, for a followed source, plans the first and then the second when it appears); the
//! second file is then overwritten with other rows at the same size, before any daemon has read it;
//! a `sluice daemon` and a `sluice consume` trainer started by hand (the external launcher) run the
//! job. The overwritten file's tasks fail naming it, and the job fails by its failure policy
//! instead of delivering the other rows.

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Int64Array, RecordBatch};
use common::{LoggedAm, sluice, write_spec};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::{EnabledStatistics, WriterProperties};

/// Rows of each file.
const ROWS: i64 = 2_000;
/// How long the AM may take to plan the job and listen (deadlock watchdog).
const PLANNED_WITHIN: Duration = Duration::from_secs(30);

/// The rows `first_id..first_id + ROWS` as one `id` column.
fn ids(first_id: i64) -> RecordBatch {
    let ids = Int64Array::from_iter_values(first_id..first_id + ROWS);
    RecordBatch::try_from_iter([("id", Arc::new(ids) as ArrayRef)]).expect("batch")
}

/// Writes the ids from `first_id` as a Parquet file whose size depends on its row count alone:
/// plain values, no dictionary, no compression, no statistics.
fn write_parquet(path: &Path, first_id: i64) {
    let properties = WriterProperties::builder()
        .set_dictionary_enabled(false)
        .set_compression(Compression::UNCOMPRESSED)
        .set_statistics_enabled(EnabledStatistics::None)
        .set_max_row_group_row_count(Some(500))
        .build();
    let batch = ids(first_id);
    let file = std::fs::File::create(path).expect("create");
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).expect("writer");
    writer.write(&batch).expect("write parquet");
    writer.close().expect("close parquet");
}

/// Writes the ids from `first_id` as an Arrow IPC file of record batches of 500 rows, whose size
/// depends on its row count alone.
fn write_ipc(path: &Path, first_id: i64) {
    let batch = ids(first_id);
    let file = std::fs::File::create(path).expect("create");
    let mut writer =
        arrow::ipc::writer::FileWriter::try_new(file, &batch.schema()).expect("ipc writer");
    for start in (0..batch.num_rows()).step_by(500) {
        writer.write(&batch.slice(start, 500)).expect("write ipc");
    }
    writer.finish().expect("finish ipc");
}

/// Starts `sluice daemon` for node 0 of the AM at `am`.
fn daemon(am: &str, ring_dir: &Path, log: &Path) -> Child {
    sluice()
        .args(["daemon", "--am", am, "--node-id", "0"])
        .arg("--ring-dir")
        .arg(ring_dir)
        .env_remove("SLUICE_TOKEN")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("the daemon's log"))
        .spawn()
        .expect("spawn sluice daemon")
}

/// Starts the job's one trainer as torchrun would, writing the ids it reads to `ids`.
fn trainer(am: &str, ring_dir: &Path, ids: &Path) -> Child {
    common::torchrun_consume(am, ring_dir, ids, (0, 1), (0, 1))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sluice consume")
}

/// Waits until the AM whose status page is at `address` has planned `files` files of its one
/// source.
fn wait_until_files_planned(address: &str, files: u64) {
    let address = address.parse().expect("the AM's address");
    let started = Instant::now();
    loop {
        let status: serde_json::Value =
            serde_json::from_str(&common::http_get(address, "/api/status")).expect("status JSON");
        if status["sources"][0]["planned_files"] == files {
            return;
        }
        assert!(
            started.elapsed() < PLANNED_WITHIN,
            "the AM did not plan {files} files within {PLANNED_WITHIN:?}: {status}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the AM listens at `address`, which it does once it has planned the job.
fn wait_until_planned(address: &str) {
    let started = Instant::now();
    while std::net::TcpStream::connect(address).is_err() {
        assert!(
            started.elapsed() < PLANNED_WITHIN,
            "the AM did not listen at {address} within {PLANNED_WITHIN:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How `part-1` joins the job.
#[derive(Clone, Copy, PartialEq)]
enum Part1 {
    /// It is there when the job is planned.
    Planned,
    /// It appears after the job was planned, in the directory the job follows.
    Followed,
}

/// Runs a job over `part-0` and `part-1` of `extension`, written by `write` with ids from 0 and
/// from `ROWS`, whose `part-1` is overwritten with ids from `100 * ROWS` at the same size after the
/// AM planned it. Returns the final error line of the AM's log: the job must fail naming `part-1`.
fn run_with_part_1_overwritten(
    format: &str,
    extension: &str,
    write: fn(&Path, i64),
    part_1: Part1,
) -> String {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let data = root.join("data");
    std::fs::create_dir(&data).expect("data directory");
    write(&data.join(format!("part-0.{extension}")), 0);
    let victim = data.join(format!("part-1.{extension}"));
    let staged = root.join(format!("part-1.{extension}"));
    write(&staged, ROWS);
    if part_1 == Part1::Planned {
        std::fs::rename(&staged, &victim).expect("place part-1");
    }
    let (name, follow) = match part_1 {
        Part1::Planned => (format!("pinned-{format}"), ""),
        Part1::Followed => (
            format!("pinned-followed-{format}"),
            ", follow: { interval_ms: 50 }",
        ),
    };
    let spec = write_spec(
        root,
        &format!(
            r#"
name: {name}
data:
  sources: [{{ uri: "file://{data}", format: {format}, columns: [id]{follow} }}]
  task_rows: 500
  batch_size: 100
nodes: 1
launcher: {{ kind: external }}
roles:
  - {{ name: worker, num: 1 }}
failover: {{ heartbeat_interval_ms: 50, heartbeat_timeout_ms: 10000, max_task_attempts: 2, task_failed_percent: 20 }}
"#,
            data = data.display(),
        ),
    );
    let am = LoggedAm::start(&spec, &root.join("am.log"));
    wait_until_planned(&am.address);
    if part_1 == Part1::Followed {
        std::fs::rename(&staged, &victim).expect("add part-1");
        wait_until_files_planned(&am.http, 2);
    }

    let planned = std::fs::metadata(&victim).expect("the victim");
    write(&victim, 100 * ROWS);
    assert_eq!(
        std::fs::metadata(&victim).expect("the victim").len(),
        planned.len(),
        "the overwrite keeps the file's size, so that only its identity tells it apart"
    );
    // A modification time a second after the planned one, as a later write has on any file
    // system's clock.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&victim)
        .expect("open the victim")
        .set_modified(planned.modified().expect("mtime") + Duration::from_secs(1))
        .expect("set mtime");

    let ring_dir = root.join("shm");
    let ids = root.join("ids-0.bin");
    let mut daemon = daemon(&am.address, &ring_dir, &root.join("daemon.log"));
    let mut trainer = trainer(&am.address, &ring_dir, &ids);
    let (succeeded, log) = am.exit();
    for child in [&mut daemon, &mut trainer] {
        let _ = child.kill();
        let _ = child.wait();
    }
    let delivered = sluice_testkit::job::read_ids(&ids);
    assert!(
        delivered.iter().all(|id| *id < 2 * ROWS),
        "no row of the overwritten file reaches the trainer: {:?}",
        delivered
            .iter()
            .filter(|id| **id >= 2 * ROWS)
            .take(5)
            .collect::<Vec<_>>()
    );
    let daemon_log = std::fs::read_to_string(root.join("daemon.log")).unwrap_or_default();
    assert!(
        !succeeded,
        "the job fails rather than deliver the overwritten file's rows\n{log}\n{daemon_log}"
    );
    let error = log
        .lines()
        .find(|line| line.starts_with(&format!("error: job {name} failed")))
        .unwrap_or_else(|| panic!("no final error line:\n{log}\n{daemon_log}"))
        .to_owned();
    assert!(
        error.contains(&format!("part-1.{extension}"))
            && error.contains("changed since it was planned")
            && error.contains("plan again"),
        "the final error names the file, says it changed and gives the fix: {error}"
    );
    println!("{error}");
    error
}

#[test]
fn a_parquet_file_overwritten_at_the_same_size_after_planning_fails_the_job_naming_it() {
    let error = run_with_part_1_overwritten("parquet", "parquet", write_parquet, Part1::Planned);
    assert!(error.contains("modified at"), "{error}");
}

#[test]
fn a_parquet_file_a_followed_source_added_then_overwritten_at_the_same_size_fails_the_job_naming_it()
 {
    let error = run_with_part_1_overwritten("parquet", "parquet", write_parquet, Part1::Followed);
    assert!(error.contains("modified at"), "{error}");
}

#[test]
fn an_arrow_ipc_file_overwritten_at_the_same_size_after_planning_fails_the_job_naming_it() {
    run_with_part_1_overwritten("ipc", "arrow", write_ipc, Part1::Planned);
}

//! `sluice run` end to end on one machine: the AM, two node daemons and four reference trainers
//! (`sluice consume`) as real processes over generated Parquet data, with every id delivered once.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::sluice;
use sluice_testkit::job::read_ids;

const ROWS: i64 = 40_000;

/// Runs `command` to its end, killing it and failing after 120 s (deadlock watchdog).
fn run_with_deadline(command: &mut Command) -> std::process::Output {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice run");
    let pid = child.id();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    match receiver.recv_timeout(std::time::Duration::from_secs(120)) {
        Ok(output) => output.expect("wait for sluice run"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("sluice run did not finish within 120 s: killed (deadlock watchdog)");
        }
    }
}

#[test]
fn two_daemons_and_four_trainers_deliver_every_row_once() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let data = common::generate(root, ROWS as u64, 4, 1000);
    let spec = common::write_spec(
        root,
        &format!(
            r#"
name: run-local
data:
  sources: [{{ uri: "file://{data}", format: parquet, columns: [id, label] }}]
  task_rows: 2000
  batch_size: 256
nodes: 2
roles:
  - {{ name: worker, num: 4, command: ["{sluice}", consume, --ids-out, "{root}/ids-{{rank}}.bin", --max-rows-per-s, "20000"] }}
failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 10000 }}
"#,
            data = data.display(),
            sluice = env!("CARGO_BIN_EXE_sluice"),
            root = root.display(),
        ),
    );
    // The second run finds the first run's finished rings, which must not pass for its data.
    for _ in 0..2 {
        for rank in 0..4 {
            let _ = std::fs::remove_file(root.join(format!("ids-{rank}.bin")));
        }
        run_job(root, &spec, "run-local", &(0..ROWS).collect::<Vec<_>>());
    }
}

/// A Delta table whose deletion vector (its version 1) removes two of its ten rows, cut in tasks of
/// two rows: read at its latest version, and pinned at version 0, before the deletion.
#[test]
fn a_delta_table_is_delivered_once_at_its_latest_version_and_at_a_pinned_one() {
    let table = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/testdata/delta/table-with-dv-small");
    assert!(
        table.is_dir(),
        "conformance data missing at {}: the shared test data must sit beside the repository",
        table.display()
    );
    let table = table.canonicalize().expect("table path");
    for (pin, expected) in [
        ("", (1..=8).collect::<Vec<i64>>()),
        (", version: 0", (0..10).collect()),
    ] {
        let directory = tempfile::tempdir().expect("tempdir");
        let root = directory.path();
        let spec = common::write_spec(
            root,
            &format!(
                r#"
name: run-delta
data:
  sources: [{{ uri: "file://{table}", format: delta{pin} }}]
  task_rows: 2
  batch_size: 1
nodes: 2
roles:
  - {{ name: worker, num: 4, command: ["{sluice}", consume, --ids-out, "{root}/ids-{{rank}}.bin", --id-column, value] }}
failover: {{ heartbeat_interval_ms: 50, heartbeat_timeout_ms: 10000 }}
"#,
                table = table.display(),
                sluice = env!("CARGO_BIN_EXE_sluice"),
                root = root.display(),
            ),
        );
        run_job(root, &spec, "run-delta", &expected);
    }
}

/// Runs `sluice run SPEC` with its rings under `root` and its state in `root/state`, to its end.
fn run_spec(root: &Path, spec: &Path, state: &str) -> std::process::Output {
    run_with_deadline(
        sluice()
            .arg("run")
            .arg(spec)
            .arg("--ring-dir")
            .arg(root.join("rings"))
            .arg("--state-dir")
            .arg(root.join(state)),
    )
}

/// A one-node job `name` whose data section is `data` (YAML lines under `data:`, indented by two)
/// and whose `workers` reference trainers write the ids they read to `root/ids-RANK.bin`.
fn ids_spec(root: &Path, name: &str, data: &str, workers: u32) -> std::path::PathBuf {
    common::write_spec(
        root,
        &format!(
            r#"
name: {name}
data:
{data}
nodes: 1
roles:
  - {{ name: worker, num: {workers}, command: ["{sluice}", consume, --ids-out, "{root}/ids-{{rank}}.bin"] }}
failover: {{ heartbeat_interval_ms: 50, heartbeat_timeout_ms: 10000 }}
"#,
            sluice = env!("CARGO_BIN_EXE_sluice"),
            root = root.display(),
        ),
    )
}

/// The ids the trainers of ranks `0..ranks` wrote under `root`, rank after rank.
fn delivered_ids(root: &Path, ranks: u32) -> Vec<i64> {
    (0..ranks)
        .flat_map(|rank| read_ids(&root.join(format!("ids-{rank}.bin"))))
        .collect()
}

/// Runs the job of `spec` and checks that its trainers saw exactly the ids `expected`, once each.
fn run_job(root: &Path, spec: &Path, job: &str, expected: &[i64]) {
    let output = run_spec(root, spec, "state");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let logs = sluice_testkit::job::logs(&root.join("state"));
    assert!(
        output.status.success(),
        "{job}: sluice run failed:\n{stdout}\n{}\n{logs}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains(&format!("job {job} succeeded")), "{stdout}");
    let mut ids = delivered_ids(root, 4);
    let delivered = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), delivered, "{job}: some ids were delivered twice");
    assert_eq!(ids, expected, "{job}: every id delivered");
}

#[test]
fn tasks_whose_rows_the_filter_removes_still_complete() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let data = common::generate(root, 4000, 2, 500);
    let spec = ids_spec(
        root,
        "run-filter",
        &format!(
            r#"  sources: [{{ uri: "file://{}", format: parquet, filter: "id < 700 or id >= 3900" }}]
  task_rows: 500
  batch_size: 128"#,
            data.display()
        ),
        1,
    );
    let output = run_spec(root, &spec, "state");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let mut ids = read_ids(&root.join("ids-0.bin"));
    ids.sort_unstable();
    let expected: Vec<i64> = (0..700).chain(3900..4000).collect();
    assert_eq!(ids, expected);
}

/// Runs a job over two files whose second one `damage` changes after the job was planned: its
/// tasks fail on every attempt, and the job must end by the failure policy with a message naming the
/// file, without hanging. Returns what `sluice run` printed.
fn run_with_a_file_damaged(name: &str, damage: impl FnOnce(&Path)) -> String {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let data = common::generate(root, 8000, 2, 1000);
    let victim = data.join("part-00001.parquet");
    let spec = common::write_spec(
        root,
        &format!(
            r#"
name: {name}
data:
  sources: [{{ uri: "file://{data}", format: parquet }}]
  task_rows: 1000
  batch_size: 250
nodes: 1
roles:
  - {{ name: worker, num: 1, command: ["{sluice}", consume, --max-rows-per-s, "4000"] }}
failover: {{ heartbeat_interval_ms: 50, heartbeat_timeout_ms: 10000, max_task_attempts: 2, task_failed_percent: 20 }}
"#,
            data = data.display(),
            sluice = env!("CARGO_BIN_EXE_sluice"),
        ),
    );
    let mut run = sluice()
        .arg("run")
        .arg(&spec)
        .arg("--ring-dir")
        .arg(root.join("rings"))
        .arg("--state-dir")
        .arg(root.join("state"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice run");
    // The daemon creates the trainer's ring once it has registered, which the AM allows only after
    // it planned the job: the damage comes after the plan.
    let ring = root.join("rings").join(name).join("0.ring");
    let waited = std::time::Instant::now();
    while !ring.exists() {
        if let Some(status) = run.try_wait().expect("try_wait") {
            panic!(
                "sluice run ended with {status} before its ring {} appeared",
                ring.display()
            );
        }
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(60),
            "the ring {} did not appear within 60 s",
            ring.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    damage(&victim);
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = run.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() > std::time::Duration::from_secs(120) {
            let _ = run.kill();
            panic!("the job did not end within 120 s of the damage (a hang)");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let output = run.wait_with_output().expect("output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!status.success(), "the job must fail: {text}");
    let error = text
        .lines()
        .find(|line| line.starts_with(&format!("error: job {name} failed")))
        .unwrap_or_else(|| panic!("no final error line: {text}"));
    assert!(
        error.contains("part-00001.parquet"),
        "the final error names the file: {text}"
    );
    error.to_owned()
}

/// The file's bytes are overwritten in place, footer included.
#[test]
fn a_file_corrupted_during_the_job_fails_it_by_the_policy_naming_the_file() {
    run_with_a_file_damaged("run-corrupt", |victim| {
        let size = std::fs::metadata(victim).expect("victim").len() as usize;
        std::fs::write(victim, vec![0x5a; size]).expect("corrupt the file");
    });
}

/// The object is deleted from the store.
#[test]
fn an_object_deleted_during_the_job_fails_it_by_the_policy_naming_it() {
    let error = run_with_a_file_damaged("run-deleted", |victim| {
        std::fs::remove_file(victim).expect("delete the file");
    });
    assert!(
        error.contains("No such file") || error.to_lowercase().contains("not found"),
        "the final error says the object is missing: {error}"
    );
}

/// A row group of one file does not decode (its first page header is overwritten before the job
/// plans it). With `data.on_bad_data: skip`, the job succeeds, every other row arrives once, and
/// `sluice run`'s summary names the file, the row group and the cause.
#[test]
fn a_row_group_that_does_not_decode_is_skipped_and_named_in_the_summary() {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let data = common::generate(root, 4000, 2, 500);
    let victim = data.join("part-00001.parquet");
    let builder = ParquetRecordBatchReaderBuilder::try_new(
        std::fs::File::open(&victim).expect("open the file"),
    )
    .expect("a parquet file");
    let bad_ids: Vec<i64> = builder
        .with_row_groups(vec![1])
        .build()
        .expect("a reader")
        .flat_map(|batch| {
            let batch = batch.expect("a batch");
            let ids = batch.column_by_name("id").expect("an id column");
            let ids = arrow::compute::cast(ids, &arrow::datatypes::DataType::Int64).expect("ints");
            ids.as_any()
                .downcast_ref::<arrow::array::Int64Array>()
                .expect("int64")
                .values()
                .to_vec()
        })
        .collect();
    assert_eq!(bad_ids.len(), 500);
    sluice_testkit::corrupt_row_group(&victim, 1);

    let spec = ids_spec(
        root,
        "run-bad-data",
        &format!(
            r#"  sources: [{{ uri: "file://{}", format: parquet }}]
  task_rows: 1000
  batch_size: 128
  on_bad_data: skip
  max_bad_fraction: 0.2"#,
            data.display()
        ),
        2,
    );
    let output = run_spec(root, &spec, "state");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("bad data: 500 rows skipped in 1 skips")
            && stdout.contains(&format!(
                "{} row group 1: 500 rows: parquet file",
                victim.display()
            )),
        "the summary names the skip: {stdout}"
    );
    let mut ids = delivered_ids(root, 2);
    ids.sort_unstable();
    let expected: Vec<i64> = (0..4000).filter(|id| !bad_ids.contains(id)).collect();
    assert_eq!(ids, expected, "every other row once");
}

/// A file whose footer does not decode (`PARQUET-1481.parquet`, a corrupt schema) among two good
/// ones, first in path order, so that the schema must come from another: with `data.on_bad_data:
/// skip` it is left out of the plan and named in the summary, and every row of the others
/// arrives once; with a budget it passes, the job does not start, naming it.
#[test]
fn a_file_whose_footer_does_not_decode_is_left_out_of_the_plan_and_named() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let data = common::generate(root, 2000, 2, 500);
    let corrupt = sluice_testkit::testdata().join("parquet/bad_data/PARQUET-1481.parquet");
    std::fs::copy(&corrupt, data.join("PARQUET-1481.parquet")).expect("copy the corrupt file");
    let spec_with = |name: &str, budget: f64| {
        ids_spec(
            root,
            name,
            &format!(
                r#"  sources: [{{ uri: "file://{}", format: parquet }}]
  task_rows: 500
  batch_size: 128
  on_bad_data: warn
  max_bad_fraction: {budget}"#,
                data.display()
            ),
            1,
        )
    };
    let output = run_spec(root, &spec_with("run-bad-file", 0.5), "state");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("bad data: 0 rows skipped in 1 skips")
            && stdout.contains("PARQUET-1481.parquet: 0 rows: parquet file"),
        "the summary names the file left out: {stdout}"
    );
    let mut ids = read_ids(&root.join("ids-0.bin"));
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..2000).collect::<Vec<i64>>(),
        "every row of the good files once"
    );

    let output = run_spec(root, &spec_with("run-bad-file-budget", 0.2), "state-budget");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        !output.status.success(),
        "past the budget the job fails: {text}"
    );
    assert!(
        text.contains("1 of its 3 files do not decode, past data.max_bad_fraction (0.2)")
            && text.contains("PARQUET-1481.parquet"),
        "{text}"
    );
}

//! `sluice run` of jobs that follow their source: a Parquet directory that gains a file while the
//! job runs, ended by `sluice stop`, and a Delta table that gains a commit, ended by
//! `follow.until_version`. Every id of the data, old and new, reaches the trainers exactly once.

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::sluice;

/// Rows of the data the job starts with; the file added later holds ids `ROWS..ROWS + ADDED`.
const ROWS: u64 = 4000;
const ADDED: u64 = 1000;

/// Writes the file of ids `ROWS..ROWS + ADDED` under `staging` and returns its path: the last of
/// five generated files over `ROWS + ADDED` rows.
fn added_file(staging: &Path, format: &str) -> std::path::PathBuf {
    let status = sluice()
        .args(["gen", "--out"])
        .arg(staging)
        .args(["--rows", &(ROWS + ADDED).to_string(), "--files", "5"])
        .args(["--row-group-rows", "500", "--format", format])
        .stdout(Stdio::null())
        .status()
        .expect("run sluice gen");
    assert!(status.success(), "sluice gen failed");
    staging.join("part-00004.parquet")
}

/// A running `sluice run`, its output going to `root/run.out`; killed if the test fails first.
struct Run {
    child: Child,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_run(root: &Path, spec: &Path, listen: &str) -> Run {
    let output = std::fs::File::create(root.join("run.out")).expect("output file");
    let child = sluice()
        .arg("run")
        .arg(spec)
        .args(["--listen", listen])
        .arg("--ring-dir")
        .arg(root.join("rings"))
        .arg("--state-dir")
        .arg(root.join("state"))
        .stdout(output.try_clone().expect("output file"))
        .stderr(output)
        .spawn()
        .expect("spawn sluice run");
    Run { child }
}

/// Polls `sluice status --json` until `ready` holds, failing after 60 s (deadlock watchdog).
fn wait_for(address: &str, what: &str, ready: impl Fn(&serde_json::Value) -> bool) {
    let started = Instant::now();
    loop {
        let status = sluice()
            .args(["status", "--json", "--am", address])
            .output()
            .expect("run sluice status");
        if status.status.success() {
            let json: serde_json::Value =
                serde_json::from_slice(&status.stdout).expect("status JSON");
            if ready(&json) {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "waited 60 s for {what}; last status: {json}"
            );
        } else {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the AM did not answer within 60 s: {}",
                String::from_utf8_lossy(&status.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for `sluice run` to end (failing after 120 s) and checks it succeeded and that the
/// trainers saw every id of `0..ROWS + ADDED` once.
fn finish(mut run: Run, root: &Path, job: &str) {
    let started = Instant::now();
    let status = loop {
        if let Some(status) = run.child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{job}: sluice run did not end within 120 s (deadlock watchdog)"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(root.join("run.out")).unwrap_or_default();
    assert!(status.success(), "{job}: sluice run failed: {text}");
    assert!(text.contains(&format!("job {job} succeeded")), "{text}");
    let mut ids: Vec<i64> = (0..2)
        .flat_map(|rank| {
            std::fs::read(root.join(format!("ids-{rank}.bin")))
                .unwrap_or_default()
                .chunks_exact(8)
                .map(|chunk| i64::from_le_bytes(chunk.try_into().expect("8 bytes")))
                .collect::<Vec<_>>()
        })
        .collect();
    let delivered = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), delivered, "{job}: some ids were delivered twice");
    assert_eq!(
        ids,
        (0..(ROWS + ADDED) as i64).collect::<Vec<_>>(),
        "{job}: every id of both the first data and the added file"
    );
}

fn spec_text(name: &str, source: &str, root: &Path) -> String {
    format!(
        r#"
name: {name}
data:
  sources: [{source}]
  task_rows: 500
  batch_size: 100
nodes: 1
roles:
  - {{ name: worker, num: 2, command: ["{sluice}", consume, --ids-out, "{root}/ids-{{rank}}.bin", --max-rows-per-s, "2000"] }}
failover: {{ heartbeat_interval_ms: 50, heartbeat_timeout_ms: 10000 }}
"#,
        sluice = env!("CARGO_BIN_EXE_sluice"),
        root = root.display(),
    )
}

fn consumed_some(status: &serde_json::Value) -> bool {
    status["tasks"]["rows_consumed"].as_u64().unwrap_or(0) > 0
}

#[test]
fn a_file_renamed_into_a_followed_directory_is_delivered_and_stop_ends_the_job() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let data = common::generate(root, ROWS, 4, 500);
    let spec = common::write_spec(
        root,
        &spec_text(
            "follow-parquet",
            &format!(
                r#"{{ uri: "file://{}", format: parquet, follow: {{ interval_ms: 100 }} }}"#,
                data.display()
            ),
            root,
        ),
    );
    let address = common::free_address();
    let run = spawn_run(root, &spec, &address);
    wait_for(&address, "the first rows to be consumed", consumed_some);

    // Written elsewhere, then renamed in: the directory never shows a half-written file.
    let written = added_file(&root.join("staging"), "parquet");
    std::fs::rename(&written, data.join("part-00004.parquet")).expect("rename into the source");
    wait_for(&address, "the new file to be planned", |status| {
        let source = &status["sources"][0];
        source["following"] == true && source["planned_files"] == 5
    });
    let stop = sluice()
        .args(["stop", "--am", &address])
        .output()
        .expect("run sluice stop");
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    finish(run, root, "follow-parquet");
}

#[test]
fn a_delta_commit_up_to_until_version_is_delivered_and_the_job_ends_by_itself() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let table = root.join("table");
    let status = sluice()
        .args(["gen", "--out"])
        .arg(&table)
        .args(["--rows", &ROWS.to_string(), "--files", "4"])
        .args(["--row-group-rows", "500", "--format", "delta"])
        .stdout(Stdio::null())
        .status()
        .expect("run sluice gen");
    assert!(status.success(), "sluice gen --format delta failed");
    let spec = common::write_spec(
        root,
        &spec_text(
            "follow-delta",
            &format!(
                r#"{{ uri: "file://{}", format: delta, follow: {{ interval_ms: 100, until_version: 1 }} }}"#,
                table.display()
            ),
            root,
        ),
    );
    let address = common::free_address();
    let run = spawn_run(root, &spec, &address);
    wait_for(&address, "the first rows to be consumed", consumed_some);

    // Version 1 appends a file of new ids, committed as a writer would: data first, then the log.
    let written = added_file(&root.join("staging"), "parquet");
    let target = table.join("part-00004.parquet");
    std::fs::rename(&written, &target).expect("move the data file in");
    let size = std::fs::metadata(&target).expect("data file").len();
    let commit = format!(
        "{}\n{}\n",
        r#"{"commitInfo":{"timestamp":1700000000000,"operation":"WRITE","operationParameters":{"mode":"Append"}}}"#,
        format_args!(
            r#"{{"add":{{"path":"part-00004.parquet","partitionValues":{{}},"size":{size},"modificationTime":1700000000000,"dataChange":true,"stats":"{{\"numRecords\":{ADDED}}}"}}}}"#
        )
    );
    let log = table.join("_delta_log");
    std::fs::write(log.join(".00000000000000000001.json.tmp"), commit).expect("write commit");
    std::fs::rename(
        log.join(".00000000000000000001.json.tmp"),
        log.join("00000000000000000001.json"),
    )
    .expect("publish commit");
    finish(run, root, "follow-delta");
}

/// `kill -9` of an AM that has planned a followed source's new file: the AM started again with the
/// same spec and checkpoint location has the same task table, added splits included, and does not
/// plan the file a second time.
#[test]
fn an_am_killed_after_planning_a_new_file_comes_back_with_its_splits() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let data = common::generate(root, ROWS, 4, 500);
    let spec = common::write_spec(
        root,
        &format!(
            r#"
name: follow-recovery
data:
  sources: [{{ uri: "file://{}", format: parquet, follow: {{ interval_ms: 50 }} }}]
  task_rows: 300
nodes: 1
roles:
  - {{ name: worker, num: 1, command: [sluice, consume] }}
failover: {{ heartbeat_interval_ms: 50, heartbeat_timeout_ms: 30000 }}
checkpoint: {{ uri: "file://{}" }}
"#,
            data.display(),
            root.join("ckpt").display()
        ),
    );
    let am = common::AmProcess::start(&spec, "127.0.0.1:0", &[]);
    let written = added_file(&root.join("staging"), "parquet");
    std::fs::rename(&written, data.join("part-00004.parquet")).expect("rename into the source");
    wait_for(&am.address, "the new file to be planned", |status| {
        status["sources"][0]["planned_files"] == 5
    });
    let before = common::status_json(&am.address);
    assert_eq!(before["tasks"]["rows_total"], ROWS + ADDED, "{before}");
    am.kill();

    let am = common::AmProcess::start(&spec, "127.0.0.1:0", &[]);
    let after = common::status_json(&am.address);
    assert_eq!(after["tasks"], before["tasks"], "the same task table");
    let polls = |status: &serde_json::Value| status["sources"][0]["polls"].as_u64().expect("polls");
    let mut sources = after["sources"].clone();
    sources[0]["polls"] = before["sources"][0]["polls"].clone();
    assert_eq!(
        sources, before["sources"],
        "the same sources, but for this AM's polls"
    );
    // Three polls of this AM later, the file is still planned once.
    let first = polls(&after);
    wait_for(&am.address, "three more polls of the source", |status| {
        polls(status) >= first + 3
    });
    let later = common::status_json(&am.address);
    assert_eq!(later["tasks"], before["tasks"], "{later}");
    assert_eq!(later["sources"][0]["planned_files"], 5);
}
